"""Every workload against a real llama-server on the tiny model: length distributions, a ShareGPT
dataset, multi-turn sessions (cache off and on, id_slot affinity), trace replay, the mixed-traffic
experiment with the server restarted at two batch sizes, and a reasoning template.

Bounded and loopback only. Assertions are on the server's own token counts, causality and the
records' labels, never on how fast this shared machine is.
"""

from __future__ import annotations

import itertools
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from load_api import settings_context
from quantload.config import Settings
from quantload.experiments.registry import run_experiment
from quantload.llamacpp.server import LlamaServer, ServerSpec
from quantload.llamacpp.toolchain import Toolchain
from quantload.load.records import RequestRecord, StageEvent, iter_records, iter_stage_events
from quantload.served import ServedTarget
from quantload.stack.run_steps import Served
from quantload.stack.server_variants import ServerVariants

pytestmark = pytest.mark.integration
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


@pytest.fixture(scope="module")
def server(
    toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LlamaServer]:
    """One llama-server (tiny Q4_K_M, 4 slots of 2048 tokens) shared by this module's tests."""
    logs = tmp_path_factory.mktemp("llama-traffic")
    spec = ServerSpec(model_path=tiny_models["Q4_K_M"], alias="tiny", slots=4, ctx_per_slot=2048)
    with LlamaServer(toolchain, spec, logs / "llama-server.log", startup_timeout_s=120) as started:
        yield started


@pytest.fixture
def target(server: LlamaServer) -> ServedTarget:
    return ServedTarget(name="tiny", quant="Q4_K_M", model="tiny", url=server.url)


def settings(**sections: dict[str, Any]) -> Settings:
    base: dict[str, dict[str, Any]] = {
        "load": dict(
            users=(2,), repeats=1, max_tokens=8, warmup_requests=1, request_timeout_s=60, stage_timeout_s=180,
            first_round_jitter_s=0.02, metrics_port=0,
        ),
        "slo": {"level_max_s": 5.0},  # a level decided within 5 s, or undecided
    }  # fmt: skip
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return Settings.model_validate(base)


def measured(run_dir: Path) -> list[RequestRecord]:
    return [r for r in iter_records(run_dir / "records.jsonl") if not r.warmup]


def ends(run_dir: Path) -> list[StageEvent]:
    return [e for e in iter_stage_events(run_dir / "stages.jsonl") if e.event == "stage_end"]


def test_length_distributions_are_sent_and_delivered_as_asked(target: ServedTarget, tmp_path: Path) -> None:
    chosen = settings(
        workload={"kind": "lengths", "input_lengths": "uniform:30-400", "output_lengths": "buckets:4x0.5,12x0.5",
                  "requests": 10},
    )  # fmt: skip
    done = run_experiment("sweep", target, settings_context(tmp_path, chosen, "it-lengths"))
    # the stage sends its 10 requests, then the same again until its level is decided
    assert [(s.status, s.workload) for s in done.summaries] == [("ok", "lengths")] and done.summaries[0].ok >= 10
    records = measured(tmp_path)
    assert len(records) >= 10
    for record in records:
        assert record.ok and record.workload == "lengths" and record.ignore_eos is True
        assert record.prompt_tokens_asked is not None and 30 <= record.prompt_tokens_asked <= 400
        assert record.prompt_tokens is not None and abs(record.prompt_tokens - record.prompt_tokens_asked) <= 2
        assert record.max_tokens in (4, 12) and record.completion_tokens == record.max_tokens
    exact = sum(r.prompt_tokens == r.prompt_tokens_asked for r in records)
    assert exact >= 0.8 * len(records), f"only {exact} of {len(records)} prompts had exactly the asked length"
    (end,) = ends(tmp_path)
    assert end.template_overhead_tokens is not None and end.template_overhead_tokens > 0


def test_a_sharegpt_dataset_asks_for_its_reply_lengths(target: ServedTarget, tmp_path: Path) -> None:
    dataset = tmp_path / "sharegpt.json"
    rows = [
        {"id": f"c{i}", "conversations": [{"from": "human", "value": f"Question number {i}: why is the sky blue?"},
                                          {"from": "gpt", "value": " ".join(["word"] * (3 + i))}]}
        for i in range(4)
    ]  # fmt: skip
    dataset.write_text(json.dumps(rows))
    chosen = settings(workload={"kind": "dataset", "dataset": str(dataset), "requests": 4})
    done = run_experiment("sweep", target, settings_context(tmp_path, chosen, "it-dataset"))
    assert [s.status for s in done.summaries] == ["ok"] and done.summaries[0].ok >= 4
    by_prompt = {r.prompt_id: r for r in measured(tmp_path)}
    replies = {f"c{i}": 3 + i for i in range(4)}  # "word word ..." is one token a word
    for prompt_id, record in by_prompt.items():
        conversation = prompt_id.rsplit("-", 1)[-1]
        assert record.max_tokens == record.completion_tokens == replies[conversation]
        assert record.prompt_tokens == record.prompt_tokens_asked


def test_conversations_resend_their_history_and_find_it_in_the_cache(target: ServedTarget, tmp_path: Path) -> None:
    chosen = settings(
        sessions={"users": 2, "count": 3, "turns": 3, "think_time_s": 0.05, "turn_tokens": "uniform:20-40",
                  "reply_tokens": "fixed:6", "cache_modes": (False, True)},
    )  # fmt: skip
    done = run_experiment("sessions", target, settings_context(tmp_path, chosen, "it-sessions"))
    assert [(s.phase, s.status, s.ok) for s in done.summaries] == [("cache off", "ok", 9), ("cache on", "ok", 9)]
    conversations: dict[str, list[RequestRecord]] = {}
    for record in measured(tmp_path):
        assert record.ok and record.session_id is not None and record.turn is not None
        conversations.setdefault(record.session_id, []).append(record)
    assert len(conversations) == 6
    for turns in conversations.values():
        turns.sort(key=lambda r: r.turn or 0)
        assert [r.turn for r in turns] == [0, 1, 2]
        for before, after in itertools.pairwise(turns):
            assert after.sent_unix_s >= before.sent_unix_s + (before.e2e_s or 0)  # one turn after the other
            # the history grew by the reply the server gave and the next user turn (>= 20 tokens)
            assert (after.prompt_tokens or 0) >= (before.prompt_tokens or 0) + (before.completion_tokens or 0) + 20
        cached = [(r.timings or {}).get("cache_n", 0) for r in turns[1:]]
        if turns[0].cache_prompt:
            assert all(c > 0 for c in cached), cached
        else:
            assert all(c == 0 for c in cached), cached


def test_id_slot_affinity_pins_every_turn(target: ServedTarget, tmp_path: Path) -> None:
    chosen = settings(
        sessions={"users": 2, "count": 4, "turns": 2, "think_time_s": 0.0, "turn_tokens": "fixed:30",
                  "reply_tokens": "fixed:4", "cache_modes": (True,), "affinity": "id_slot"},
    )  # fmt: skip
    run_experiment("sessions", target, settings_context(tmp_path, chosen, "it-affinity"))
    records = measured(tmp_path)
    assert len(records) == 8 and all(r.ok for r in records)
    slots: dict[str | None, set[int | None]] = {}
    for record in records:
        slots.setdefault(record.session_id, set()).add(record.id_slot)
    assert sorted(slot for found in slots.values() for slot in found) == [0, 1, 2, 3]  # one slot each


def test_a_trace_is_replayed_at_its_pace_from_the_intended_send_times(target: ServedTarget, tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    arrivals = [0, 400, 800, 1200, 2000, 2400]  # Mooncake style: milliseconds
    trace.write_text(
        "".join(json.dumps({"timestamp": t, "input_length": 40 + i, "output_length": 3 + i}) + "\n"
                for i, t in enumerate(arrivals))
    )  # fmt: skip
    chosen = settings(trace={"path": str(trace), "speed": 2.0})
    done = run_experiment("trace", target, settings_context(tmp_path, chosen, "it-trace"))
    assert [(s.experiment, s.status, s.ok) for s in done.summaries] == [("trace", "ok", 6)]
    records = sorted(measured(tmp_path), key=lambda r: r.intended_unix_s)
    first = records[0].intended_unix_s
    for record, arrival in zip(records, arrivals, strict=True):
        assert record.intended_unix_s - first == pytest.approx(arrival / 1000 / 2.0, abs=0.01)
        assert record.ttft_from_intended_s == pytest.approx((record.ttft_s or 0) + record.lag_s)
        assert record.completion_tokens == record.max_tokens
    assert sorted((r.prompt_tokens_asked, r.max_tokens) for r in records) == [(40 + i, 3 + i) for i in range(6)]


def test_mixed_traffic_restarts_the_server_at_each_batch_size(
    server: LlamaServer, toolchain: Toolchain, tmp_path: Path
) -> None:
    served = Served("Q4_K_M", server, name="tiny", model="tiny")
    variants = ServerVariants(server, served.load_target(), toolchain, tmp_path, in_place=True)
    base_args, port = server.spec.extra_args, server.port
    chosen = settings(
        mixed={"users": 2, "decode_requests": 4, "decode_prompt_tokens": 24, "decode_output_tokens": 12,
               "long_prompt_tokens": 900, "long_output_tokens": 2, "long_fraction": 0.34,
               "batch_sizes": ("2048/512", "64/64")},
    )  # fmt: skip
    done = run_experiment("mixed", served.load_target(), settings_context(tmp_path, chosen, "it-mixed"), variants)
    assert [(s.server_args, s.phase, s.status) for s in done.summaries] == [
        ("-b 2048 -ub 512", "alone", "ok"), ("-b 2048 -ub 512", "mixed", "ok"),
        ("-b 64 -ub 64", "alone", "ok"), ("-b 64 -ub 64", "mixed", "ok"),
    ]  # fmt: skip
    records = measured(tmp_path)
    long = [r for r in records if r.request_class == "long_prompt"]
    decode = [r for r in records if r.request_class == "decode"]
    assert len(decode) == 16 and len(long) == 4 and all(r.ok for r in records)
    assert all(r.prompt_tokens is not None and abs(r.prompt_tokens - 900) <= 2 for r in long)
    assert all(r.completion_tokens == 12 and r.itl_count >= 1 for r in decode)
    batches = re.findall(r"llama_context: n_u?batch\s+= (\d+)", server.log_text())
    # each batch size a variant, the server restarted as it was after each
    assert batches[-8:] == ["2048", "512", "2048", "512", "64", "64", "2048", "512"]
    assert server.spec.extra_args == base_args and server.port == port and server.alive()  # as it was


def test_reasoning_content_counts_as_generated_and_the_answer_is_apart(
    toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    spec = ServerSpec(
        model_path=tiny_models["Q4_K_M"], alias="tiny", slots=2, ctx_per_slot=1024,
        extra_args=("--jinja", "--chat-template-file", str(FIXTURES / "think-template.jinja"),
                    "--reasoning-format", "deepseek"),
    )  # fmt: skip
    with LlamaServer(toolchain, spec, tmp_path / "think.log", startup_timeout_s=120) as thinking:
        target = ServedTarget(name="think", quant="Q4_K_M", model="tiny", url=thinking.url)
        chosen = settings(load={"ignore_eos": True, "prompt_count": 3, "users": (1,)})
        done = run_experiment("sweep", target, settings_context(tmp_path, chosen, "it-think"))
    assert [s.status for s in done.summaries] == ["ok"] and done.summaries[0].ok >= 3
    for record in measured(tmp_path):
        assert record.reasoning_chunks >= 1 and record.content_chunks >= record.reasoning_chunks
        assert record.ttft_s is not None and record.completion_tokens == 8
        # the template opens a thinking block the random model never closes: no answer content
        assert record.ttft_content_s is None
