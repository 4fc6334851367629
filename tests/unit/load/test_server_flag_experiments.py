"""The batching, slots and speculation experiments without a load: where they run, the KV budget
split into slots, the log probe, and the speculation variants.

Against fake servers with real Locust processes:
tests/integration/load/test_server_flag_experiments_processes.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from load_api import context
from quantload.config import load_config
from quantload.errors import ConfigError
from quantload.experiments import registry
from quantload.experiments.slots import stages as slots
from quantload.experiments.speculation import stages as speculation
from quantload.experiments.speculation.probe import (
    check_before,
    read_counters,
    slots_speculative,
    startup_problem,
)
from quantload.served import ServedTarget

TARGET = ServedTarget(name="llama-q8_0", quant="Q8_0", model="m", url="http://127.0.0.1:1")


def test_the_flag_experiments_run_only_where_quantload_started_the_server(tmp_path: Path) -> None:
    flags = ["batching", "slots", "speculation"]
    assert [e.name for e in registry.REGISTRY if not e.by_default and e.server_flags != "none"] == flags
    run = context(tmp_path)
    assert not {"batching", "slots", "speculation"} & set(registry.requested_names(run.settings))
    for name in ("batching", "slots", "speculation"):
        with pytest.raises(ConfigError, match="starts llama-servers of its own"):
            registry.against_any_server([name])


def test_a_kv_budget_that_does_not_split_into_whole_slots_is_refused_before_any_server(
    tmp_path: Path,
) -> None:
    run = context(tmp_path, slots={"counts": [1, 2, 4], "kv_cells": 2560})
    with pytest.raises(ConfigError) as caught:
        slots.slot_layouts(run.settings)
    assert "2,560 cells does not split into 4 slots" in caught.value.problem
    assert caught.value.hint == "set slots.kv_cells to a multiple of 1,024"
    layouts = slots.slot_layouts(context(tmp_path, server={"slots": 8, "ctx_per_slot": 4096}).settings)
    assert [(layout.slots, layout.ctx_per_slot) for layout in layouts] == [
        (1, 32768),
        (2, 16384),
        (4, 8192),
        (8, 4096),
        (16, 2048),
    ]
    with pytest.raises(ConfigError, match="slot counts must rise, each once"):
        load_config(tmp_path, {}, {"slots.counts": [4, 2]})


def test_the_probe_reads_the_log_line_the_slots_flag_and_the_counters() -> None:
    log = "srv load_model: initializing\nsrv  load_model: failed to initialize speculative decoding context: vocab\n"
    assert startup_problem(log) == "srv  load_model: failed to initialize speculative decoding context: vocab"
    assert startup_problem("srv load_model: initializing, n_slots = 2\n") is None
    assert slots_speculative([{"id": 0, "speculative": True}, {"id": 1, "speculative": True}]) is True
    assert slots_speculative([{"id": 0, "speculative": True}, {"id": 1, "speculative": False}]) is False
    assert slots_speculative([{"id": 0}]) is None and slots_speculative({"error": 1}) is None
    text = (
        "# TYPE llamacpp:spec_decode_num_draft_tokens_total counter\nllamacpp:spec_decode_num_draft_tokens_total 282\n"
        "# TYPE llamacpp:spec_decode_num_accepted_tokens_total counter\n"
        "llamacpp:spec_decode_num_accepted_tokens_total 194\n"
        "# TYPE llamacpp:spec_decode_num_drafts_total counter\nllamacpp:spec_decode_num_drafts_total 40\n"
    )
    assert read_counters(text) == {"draft_tokens": 282.0, "accepted_tokens": 194.0, "drafts": 40.0}
    check = check_before(TARGET, log)
    assert not check.speculating and "failed to initialize speculative decoding context" in check.why


def test_the_variants_are_off_the_ngram_type_the_draft_and_each_synthetic_length(tmp_path: Path) -> None:
    run = context(tmp_path, speculation={"draft_model": "d.gguf", "draft_n_max": 5, "synth_lengths": [2.5]})
    made = speculation.spec_variants(run.settings)
    assert [(v.kind, v.flags.label, v.flags.extra_args) for v in made] == [
        ("off", "spec off", ("--spec-type", "none")),
        ("ngram", "spec ngram default", ("--spec-default", "--spec-draft-n-max", "5")),
        (
            "draft",
            "spec draft d",
            ("-md", "d.gguf", "--spec-type", "draft-simple", "--spec-draft-n-max", "5"),
        ),
        (
            "synth",
            "spec synth 2.5",
            (
                "-md",
                "d.gguf",
                "--spec-type",
                "draft-simple",
                "--spec-draft-n-max",
                "5",
                "--spec-synth-len",
                "2.5",
            ),
        ),
    ]
    repeat = speculation.traffic(run.settings, "repeat", 3, tmp_path)
    texts = [repeat.texts[r.prompt_id] for r in repeat.requests]
    assert texts[0].startswith("Repeat the following text exactly") and texts[1].startswith(
        "Copy the following text"
    )
    free = speculation.traffic(run.settings, "free", 3, tmp_path)
    assert not any(free.texts[r.prompt_id].startswith(("Repeat", "Copy")) for r in free.requests)
