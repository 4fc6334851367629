"""Conversations beyond the slot and tenants sharing a server, against real llama-servers on the tiny
model: the context experiment through the run's own steps (a real HTTP 400 `exceed_context_size_error`
on overflow, a real `--context-shift`, the client's trim within the slot, the server restarted as it
was), and the noisy neighbour (each tenant's own concurrency, its records and stage lines), each
then read by the report.

Bounded (2 conversations of 3 turns per policy at 256-token slots; the neighbour at 0 and 2 users)
and loopback only. Assertions are on what the servers said and logged, never on how fast this
shared machine is.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import threading
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from quantload.analysis.report import build_report
from quantload.config import Settings, load_config
from quantload.experiments.registry import run_experiment
from quantload.llamacpp.server import LlamaServer, ServerSpec, free_port
from quantload.llamacpp.toolchain import Toolchain
from quantload.load.records import RequestRecord, iter_records, iter_stage_events
from quantload.paths import cache_root
from quantload.run_context import RunContext
from quantload.rundir.handle import RunDir
from quantload.served import ServedTarget, server_name
from quantload.stack.run_steps import RunSteps, Served

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
REPLY = 100


def _measured(run_dir: Path) -> list[RequestRecord]:
    return [r for r in iter_records(run_dir / "records.jsonl") if not r.warmup]


def _by_policy(records: list[RequestRecord], policy: str) -> list[RequestRecord]:
    return sorted((r for r in records if f"-{policy}-" in (r.stage_id or "")), key=lambda r: (r.session_id, r.turn))


def test_a_real_refusal_a_real_shift_and_a_trim_within_the_slot(
    toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    # the first turn and its reply fit the 256-token slot; the second turn's 100-token reply runs past
    # its end (truncated without shift, shifted with it); the third turn's history no longer fits
    # (how many tokens the tiny model's replies take when sent back varies, so a shifted
    # conversation's next prompt may still fit)
    flags = {
        "model.source": "tiny", "run.profile": "ci", "load.warmup_requests": 1,
        "context.conversations": 2, "context.users": 2, "context.slots": 2, "context.ctx_per_slot": 256,
        "context.turns": 3, "context.system_prompt_tokens": 24, "context.turn_tokens": "fixed:10",
        "context.reply_tokens": f"fixed:{REPLY}",
    }  # fmt: skip
    settings = load_config(tmp_path, {}, flags).settings
    steps = RunSteps(settings, os.environ, cache_root(None, os.environ))
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"settings": settings.model_dump(mode="json")}))
    server = steps.server(toolchain, tiny_models["Q4_K_M"], "tiny-Q4_K_M", "Q4_K_M", run_dir)
    with server:
        steps.check_kv(toolchain, server, "Q4_K_M", run_dir)  # kv.json: the model's shape sizes the plan's slots
        served = Served("Q4_K_M", server, name=server_name("Q4_K_M"), model="tiny")
        own_args, port = server.spec.extra_args, server.port
        variants = steps.server_variants(toolchain, served, run_dir, True)
        context = RunContext(RunDir(run_dir), "it-context", settings, loadgen_port=free_port(), cwd=tmp_path)
        done = steps.experiment("context", served.load_target(), context, variants)
        assert server.alive() and server.port == port and server.spec.extra_args == own_args  # as it was
    assert [(s.context_policy, s.status) for s in done.summaries] == [("fail", "ok"), ("trim", "ok"), ("shift", "ok")]
    assert all(s.slot_context_tokens == 256 for s in done.summaries)
    records = _measured(run_dir)

    fail = _by_policy(records, "fail")
    refused = [r for r in fail if r.error_class == "context_exceeded"]
    assert len({r.session_id for r in refused}) == 2  # every conversation met the slot
    for record in refused:  # llama-server's own counts, from its 400
        assert record.http_status == 400 and record.n_ctx == 256 and (record.n_prompt_tokens or 0) >= 256
        assert "exceeds the available context size" in (record.error or "")
    assert any(r.ok and r.truncated and (r.completion_tokens or 0) < REPLY for r in fail)

    shift = _by_policy(records, "shift")
    shifted = [r for r in shift if r.ok and r.context_shifted]
    seen = [(r.turn, r.ok, r.error_class, r.prompt_tokens, r.completion_tokens, r.context_shifted) for r in shift]
    assert shifted, f"no reply ran past the slot with the shift on: {seen}"
    assert all(r.completion_tokens == REPLY and not r.truncated for r in shifted), seen
    assert all((r.prompt_tokens or 0) + (r.completion_tokens or 0) > 256 for r in shifted)
    assert all(not r.truncated for r in shift if r.ok)  # with the shift no reply stops at the slot's end
    assert all(r.n_ctx == 256 for r in shift if r.error_class == "context_exceeded")  # a prompt beyond is refused
    logs = "\n".join(p.read_text(errors="replace") for p in (run_dir / "logs").glob("llama-server-*.log"))
    assert "slot context shift" in logs and "--context-shift" in logs and "--keep" in logs

    trim = _by_policy(records, "trim")
    assert len(trim) == 6 and all(r.ok for r in trim)
    assert all((r.prompt_tokens or 0) + REPLY + 8 <= 256 for r in trim)  # the reply always had room
    trimmed = [r for r in trim if (r.trimmed_turns or 0) > 0]
    assert trimmed, f"no history was trimmed: {[(r.turn, r.prompt_tokens, r.trimmed_turns) for r in trim]}"
    assert all((r.trimmed_tokens or 0) > 0 for r in trimmed)
    for record in trimmed:  # the history's start changed: only the system prompt's part is still cached
        cached = (record.timings or {}).get("cache_n", 0)
        assert 0 < cached < (record.prompt_tokens or 0)

    paths = build_report(run_dir, settings=settings.report)
    text = paths.markdown.read_text()
    assert "## Conversations beyond the slot context" in text and "context_exceeded" in text
    assert "plots/context_by_turn.png" in text and (run_dir / "plots" / "context_by_turn.png").is_file()
    assert "## The context a slot needs" in text
    summary = json.loads(paths.summary.read_text())
    policies = {row["policy"]: row for row in summary["context_policies"]}
    assert (policies["fail"]["completed"], policies["trim"]["completed"]) == (0, 2)
    assert policies["fail"]["refused_n_ctx"] == 256
    whole = {r.session_id for r in records} - {r.session_id for r in records if not r.ok}
    assert len(whole) >= 2 and summary["plan"]["context"]["conversations"] == len(whole)  # every turn ran
    rows = summary["plan"]["context"]["rows"]
    assert {row["percentile"] for row in rows} == {50, 95, 99} and {row["cache_type"] for row in rows} >= {"f16"}
    for row in rows:  # a slot holding the conversation whole, padded as llama.cpp pads it; its KV exact
        assert row["ctx_per_slot"] % 256 == 0 and row["ctx_per_slot"] >= row["conversation_tokens"]
    kv = json.loads((run_dir / "kv.json").read_text())["results"]["Q4_K_M"]  # checked against the server's log
    per_cell = kv["predicted_bytes"] // (kv["n_stream"] * kv["cells_per_stream"])
    assert all(row["kv_bytes_per_slot"] == per_cell * row["ctx_per_slot"] for row in rows if row["cache_type"] == "f16")


@pytest.fixture
def tiny_server(toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path) -> LlamaServer:
    spec = ServerSpec(model_path=tiny_models["Q4_K_M"], alias="tiny", slots=4, ctx_per_slot=1024)
    return LlamaServer(toolchain, spec, tmp_path / "llama-server.log", startup_timeout_s=120)


def test_the_noisy_neighbour_on_a_real_server(tiny_server: LlamaServer, tmp_path: Path) -> None:
    settings = Settings.model_validate(
        {
            "load": {"warmup_requests": 1, "metrics_port": 0, "max_tokens": 6, "request_timeout_s": 60},
            "tenants": [
                {"name": "acme", "users": 1,
                 "workload": {"kind": "lengths", "input_lengths": "fixed:40", "output_lengths": "fixed:6"}},
                {"name": "burst", "users": 1, "slo_ttft_p99_s": 30.0,
                 "workload": {"kind": "lengths", "input_lengths": "fixed:300", "output_lengths": "fixed:4"}},
            ],
            "noisy_neighbour": {"steps": [0, 2], "requests_per_user": 3},
        }
    )  # fmt: skip
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"settings": settings.model_dump(mode="json")}))
    port = free_port()
    scraped: list[str] = []
    stop = threading.Event()

    def scrape() -> None:  # the load process's own /metrics while it runs
        while not stop.wait(0.3):
            with contextlib.suppress(httpx.HTTPError):
                body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2.0).text
                if 'tenant="burst"' in body:
                    scraped[:] = [body]

    watcher = threading.Thread(target=scrape, daemon=True)
    watcher.start()
    try:
        with tiny_server as server:
            target = ServedTarget(name="tiny", quant="Q4_K_M", model="tiny", url=server.url)
            context = RunContext(RunDir(run_dir), "it-nn", settings, loadgen_port=port, cwd=tmp_path)
            done = run_experiment("noisy_neighbour", target, context)
    finally:
        stop.set()
        watcher.join(timeout=5)
    assert scraped, "the load generator's /metrics never showed the tenant label"
    samples = {
        (sample.name, sample.labels.get("tenant"), sample.labels.get("outcome"))
        for family in text_string_to_metric_families(scraped[0])
        for sample in family.samples
        if sample.labels.get("experiment") == "noisy_neighbour"
    }
    assert {("quantload_requests_total", "burst", "ok"), ("quantload_ttft_seconds_count", "acme", None)} <= samples
    assert [(s.phase, s.status, s.users, s.requests, s.ok) for s in done.summaries] == [
        ("burst at 0 users", "ok", 1, 3, 3), ("burst at 2 users", "ok", 3, 9, 9),
    ]  # fmt: skip
    records = _measured(run_dir)
    assert {(r.tenant, r.max_tokens, r.ignore_eos) for r in records} == {("acme", 6, True), ("burst", 4, True)}
    assert all(r.ok and r.completion_tokens == r.max_tokens for r in records)
    burst = [r for r in records if r.tenant == "burst"]
    assert all(abs((r.prompt_tokens or 0) - 300) <= 2 for r in burst)
    second = done.summaries[1].stage_id
    acme = sorted((r.sent_unix_s, r.sent_unix_s + (r.e2e_s or 0)) for r in records
                  if r.stage_id == second and r.tenant == "acme")  # fmt: skip
    assert all(later[0] >= earlier[1] - 0.05 for earlier, later in itertools.pairwise(acme))  # 1 user
    ends = [e for e in iter_stage_events(run_dir / "stages.jsonl") if e.event == "stage_end"]
    assert [[(t.name, t.users) for t in e.tenants or []] for e in ends] == [
        [("acme", 1)], [("acme", 1), ("burst", 2)],
    ]  # fmt: skip

    paths = build_report(run_dir, settings=settings.report)
    text = paths.markdown.read_text()
    assert "## The noisy neighbour" in text and "## Tenants" in text
    assert (run_dir / "plots" / "noisy_neighbour.png").is_file()
    summary = json.loads(paths.summary.read_text())
    assert {row["tenant"] for row in summary["tenants"]} == {"acme", "burst"}
    (verdict,) = summary["noisy_verdicts"]
    assert verdict["neighbour"] == "burst" and verdict["sentence"].startswith("Q4_K_M: ")
