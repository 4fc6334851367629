"""The batching, slots and speculation experiments run against fake servers (one per variant) and a
fake `ServerControl`, with real Locust processes: the stages they run, what they file, and how a
variant that does not speculate fails.

Moved from tests/unit/load/test_server_flag_experiments.py, whose other tests start no process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from load_api import context
from quantload.config import LoadSettings
from quantload.experiments import batching, slots, speculation
from quantload.experiments.base import ExperimentContext
from quantload.experiments.variant_file import read_variants
from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.load.limit_file import read_limits
from quantload.load.records import iter_records, iter_stage_events
from quantload.load.supervisor import LoadError
from quantload.served import ServedTarget
from variant_fakes import FakeVariants

pytestmark = pytest.mark.integration

TARGET = ServedTarget(name="llama-q8_0", quant="Q8_0", model="m", url="http://127.0.0.1:1")
SCRIPT = FakeScript(ttft_ms=(2, 5), itl_ms=(1, 2), tokens=6, close_after_stream=True)
LOOSE_SLO = {
    "ttft_s": 30.0, "tpot_s": 5.0, "ttft_percentile": "p50", "tpot_percentile": "p50", "max_failed_frac": 0.5,
    "level_max_s": 5.0,
}  # fmt: skip


def load_settings(**changes: object) -> LoadSettings:
    base: dict[str, object] = dict(
        warmup_requests=1,
        request_timeout_s=10,
        first_round_jitter_s=0.01,
        metrics_port=0,
        stage_timeout_s=60,
        max_tokens=6,
        open_loop_users=4,
        prompt_count=4,
    )
    base.update(changes)
    return LoadSettings.model_validate(base)




@pytest.mark.slow
def test_batching_sends_the_same_requests_with_cb_and_nocb_closed_then_poisson_near_the_rate(
    tmp_path: Path,
) -> None:
    run = context(
        tmp_path, load_settings(), batching={"users": 2, "requests": 4, "rate_frac": 0.5}, slo=LOOSE_SLO
    )
    servers = FakeVariants()
    done = batching.run(ExperimentContext(run, TARGET, servers))
    assert done.problem is None
    assert [f.extra_args for f in servers.asked] == [("-cb",), ("-nocb",)]
    ends = [e for e in iter_stage_events(tmp_path / "stages.jsonl") if e.event == "stage_end"]
    assert [(e.server_args, e.phase, e.arrival, e.stage_users) for e in ends] == [
        ("-cb", "closed", "closed", 2),
        ("-cb", "poisson", "poisson", 4),
        ("-nocb", "closed", "closed", 2),
        ("-nocb", "poisson", "poisson", 4),
    ]
    closed_rate = done.summaries[0].requests_per_s
    assert closed_rate and ends[1].stage_rate_rps == pytest.approx(0.5 * closed_rate)
    assert ends[3].stage_rate_rps == ends[1].stage_rate_rps  # the same traffic for static batching
    measured = [r for r in iter_records(tmp_path / "records.jsonl") if not r.warmup]
    by_stage: dict[str, list[str]] = {}
    for record in measured:
        by_stage.setdefault(str(record.stage_id), []).append(record.prompt_id)
    assert len({tuple(sorted(ids)) for ids in by_stage.values()}) == 1 and not any(
        r.cache_prompt for r in measured
    )
    assert [line.label for line in read_variants(tmp_path)] == ["-cb", "-nocb"]


@pytest.mark.slow
def test_without_a_limit_found_batching_searches_its_own_under_its_variant_name(tmp_path: Path) -> None:
    run = context(
        tmp_path,
        load_settings(),
        batching={"requests": 4},
        slo=LOOSE_SLO,
        limit={"max_users": 2, "requests_per_user": 2, "min_requests": 2},
    )
    with FakeServer(SCRIPT) as own:
        target = TARGET.model_copy(update={"url": own.url})
        done = batching.run(ExperimentContext(run, target, FakeVariants()))
    (line,) = read_limits(tmp_path / "limits.jsonl")
    assert line.variant == "batching: limit as configured" and line.limit == 2
    assert {s.users for s in done.summaries if s.arrival == "closed"} == {2}
    assert done.busy_s > sum(s.ended_unix_s - s.started_unix_s for s in done.summaries)  # the search counts


@pytest.mark.slow
def test_slots_searches_the_limit_at_each_count_with_the_budget_split(tmp_path: Path) -> None:
    run = context(
        tmp_path,
        load_settings(),
        slots={"counts": [1, 2], "kv_cells": 1024},
        slo=LOOSE_SLO,
        limit={"max_users": 2, "requests_per_user": 2, "min_requests": 2},
    )
    servers = FakeVariants()
    done = slots.run(ExperimentContext(run, TARGET, servers))
    assert done.problem is None and done.busy_s > 0
    assert [(f.slots, f.ctx_per_slot, f.label) for f in servers.asked] == [
        (1, 1024, "slots -np 1 -c 1024"),
        (2, 512, "slots -np 2 -c 1024"),
    ]
    lines = read_limits(tmp_path / "limits.jsonl")
    assert [(line.variant, line.limit) for line in lines] == [
        ("slots -np 1 -c 1024", 2),
        ("slots -np 2 -c 1024", 2),
    ]


@pytest.mark.slow
def test_a_variant_that_never_drafts_fails_with_that_reason_and_is_never_shown_as_speculation(
    tmp_path: Path,
) -> None:
    run = context(
        tmp_path,
        load_settings(),
        slo=LOOSE_SLO,
        speculation={"users": 1, "requests": 2, "traffic": ["repeat"], "max_tokens": 6},
    )
    with pytest.raises(LoadError) as caught:
        speculation.run(ExperimentContext(run, TARGET, FakeVariants()))
    assert "measured 1 of 2 ways of speculating" in caught.value.problem
    assert (
        "spec ngram default: not speculating: no draft token was counted over 2 requests"
        in caught.value.problem
    )
    lines = {line.label: line for line in read_variants(tmp_path)}
    assert lines["spec off"].speculation is None
    check = lines["spec ngram default"].speculation
    assert check is not None and not check.speculating
    ends = [e for e in iter_stage_events(tmp_path / "stages.jsonl") if e.event == "stage_end"]
    assert [(e.server_args, e.phase) for e in ends] == [
        ("spec off", "repeat traffic"),
        ("spec ngram default", "repeat traffic"),
    ]


@pytest.mark.slow
def test_a_server_that_logged_it_cannot_speculate_runs_no_stage(tmp_path: Path) -> None:
    run = context(
        tmp_path,
        load_settings(),
        slo=LOOSE_SLO,
        speculation={"users": 1, "requests": 2, "traffic": ["free"], "max_tokens": 6},
    )
    servers = FakeVariants(
        startup_log="E srv load_model: failed to initialize speculative decoding context: x\n"
    )
    with pytest.raises(LoadError, match="the server logged"):
        speculation.run(ExperimentContext(run, TARGET, servers))
    ends = [e for e in iter_stage_events(tmp_path / "stages.jsonl") if e.event == "stage_end"]
    assert [e.server_args for e in ends] == ["spec off"]
    saved = json.loads((tmp_path / "variants.jsonl").read_text().splitlines()[-1])
    assert saved["speculation"]["speculating"] is False
