"""The context experiment run for real (Locust processes) against fake servers: each policy gets its
stage on its variant and the report reads them; on a server quantload did not start, shift is
left out and said.

Moved from tests/unit/load/test_context_overflow.py, whose other tests start no process.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path

import pytest

from load_api import settings_context
from quantload.analysis.run_data import load_run
from quantload.analysis.stage_tables import stage_table
from quantload.config import Settings
from quantload.experiments.base import ExperimentContext, ServerFlags
from quantload.experiments.context.stages import run as run_context
from quantload.experiments.context.tables import conversation_table, policy_table, turn_table
from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.load.records import iter_records
from quantload.run_context import RunContext
from quantload.served import ServedTarget
from quantload.slo import Slo
from variant_fakes import FakeVariants

pytestmark = pytest.mark.integration

TARGET = ServedTarget(name="fake", quant="Q4_K_M", model="m", url="http://127.0.0.1:1")




def refusing_beyond(n_ctx: int) -> Callable[[ServerFlags], FakeScript]:
    """A fake per variant refusing beyond its context as llama-server does."""

    def script(flags: ServerFlags) -> FakeScript:
        return FakeScript(ttft_ms=(1, 3), itl_ms=(1, 1), tokens=12, n_ctx=n_ctx, slots=flags.slots or 4,
                          enforce_context=True)  # fmt: skip

    return script


def _settings(tmp_path: Path, **changes: object) -> RunContext:
    load = {"warmup_requests": 1, "request_timeout_s": 10, "first_round_jitter_s": 0.0, "metrics_port": 0,
            "max_consecutive_errors": 2}  # fmt: skip
    values = {"conversations": 4, "users": 2, "slots": 2, "ctx_per_slot": 256, "turns": 8,
              "system_prompt_tokens": 16, "turn_tokens": "fixed:20", "reply_tokens": "fixed:12", **changes}  # fmt: skip
    return settings_context(tmp_path, Settings.model_validate({"load": load, "context": values}))


@pytest.mark.slow
def test_each_policy_gets_its_stage_on_its_variant_and_the_report_reads_them(tmp_path: Path) -> None:
    run = _settings(tmp_path, affinity="id_slot")
    servers = FakeVariants(script=refusing_beyond(256), target=TARGET)
    with FakeServer(FakeScript(n_ctx=4096)) as own:  # the server as the run started it: --keep is measured on it
        done = run_context(ExperimentContext(run, TARGET.model_copy(update={"url": own.url}), servers))
    assert [(s.phase, s.context_policy, s.status) for s in done.summaries] == [
        ("fail", "fail", "ok"), ("trim", "trim", "ok"), ("shift", "shift", "ok"),
    ]  # fmt: skip  (the breaker, at 2 in a row, ignored the expected refusals and cut turns)
    assert [(f.slots, f.ctx_per_slot) for f in servers.served] == [(2, 256), (2, 256)]  # fail and trim share one
    assert servers.served[0].extra_args == () and servers.served[1].extra_args[:2] == ("--context-shift", "--keep")
    keep = int(servers.served[1].extra_args[2])
    assert 16 <= keep <= 40  # the system prompt's whole length, as the template renders it
    records = [r for r in iter_records(tmp_path / "records.jsonl") if not r.warmup]
    fail = [r for r in records if r.stage_id and "-fail-" in r.stage_id]
    refused = [r for r in fail if r.error_class == "context_exceeded"]
    assert len({r.session_id for r in refused}) == 4 and all(r.n_ctx == 256 and (r.n_prompt_tokens or 0) >= 256
                                                             for r in refused)  # fmt: skip
    assert all(r.error_class == "session_cut" for r in fail if not r.ok and r.error_class != "context_exceeded")
    trim = [r for r in records if r.stage_id and "-trim-" in r.stage_id]
    assert len(trim) == 32 and all(r.ok and (r.prompt_tokens or 0) + 12 + 8 <= 256 for r in trim)
    assert max(r.trimmed_turns or 0 for r in trim) >= 1 and all(r.trimmed_turns is not None for r in trim)
    assert {r.id_slot for r in trim} == {0, 1}  # pinned: each conversation keeps a slot of its own

    data = load_run(tmp_path)
    stages = stage_table(data, Slo(1.0, 0.1))
    policies = policy_table(conversation_table(data.records, stages), ["Q4_K_M"])
    by_policy = {row["policy"]: row for row in policies.to_dict("records")}
    assert (by_policy["fail"]["completed"], by_policy["trim"]["completed"]) == (0, 4)
    assert by_policy["fail"]["refused_n_ctx"] == 256 and by_policy["trim"]["with_event"] == 4
    turns = turn_table(data.records, stages, ["Q4_K_M"])
    assert list(dict.fromkeys(turns["policy"])) == ["fail", "trim", "shift"]
    assert turns[turns["policy"] == "trim"]["turn"].tolist() == list(range(8))


@pytest.mark.slow
def test_on_a_server_it_did_not_start_shift_is_left_out_and_said(tmp_path: Path) -> None:
    run = _settings(tmp_path, policies=["trim", "shift"], conversations=2, turns=3)
    warnings: list[str] = []
    run = dataclasses.replace(run, warn=warnings.append)
    script = FakeScript(ttft_ms=(1, 2), itl_ms=(1, 1), tokens=12, n_ctx=256, enforce_context=True)
    with FakeServer(script) as fake:
        done = run_context(ExperimentContext(run, TARGET.model_copy(update={"url": fake.url})))
    assert [s.phase for s in done.summaries] == ["trim"]
    assert any("cannot be restarted with --context-shift: the shift policy is left out" in w for w in warnings)
