"""The soak on the tiny model, through the run's own steps: a real llama-server quantload started,
its resident memory read from /proc and its KV cells from /slots while two users hold the load for
four slices; then the report's soak section and summary.json entry of that run.

Assertions are on what the run files say (slices, readings, drifts present), never on how fast the
server was or how much its memory moved.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from quantload.config import load_config
from quantload.experiments.soak.watch import read_soak_lines
from quantload.llamacpp.server import free_port
from quantload.llamacpp.toolchain import Toolchain
from quantload.load.records import iter_records, iter_stage_events
from quantload.paths import cache_root
from quantload.run_context import RunContext
from quantload.rundir.handle import RunDir
from quantload.rundir.jsonl import BadLines
from quantload.served import server_name
from quantload.stack.run_steps import RunSteps, Served

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]


def test_a_short_soak_reads_the_real_servers_memory_and_cells_every_slice(
    toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    flags = {
        "model.source": "tiny", "run.profile": "ci", "load.experiments": ("soak",), "load.max_tokens": 8,
        "load.warmup_requests": 1, "soak.duration_s": 12, "soak.slice_s": 3, "soak.sample_s": 0.5,
        "soak.users": 2,
    }  # fmt: skip
    settings = load_config(tmp_path, {}, flags).settings
    steps = RunSteps(settings, os.environ, cache_root(None, os.environ))
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    server = steps.server(toolchain, tiny_models["Q8_0"], "tiny-Q8_0", "Q8_0", run_dir)
    with server:
        served = Served("Q8_0", server, name=server_name("Q8_0"), model="tiny")
        variants = steps.server_variants(toolchain, served, run_dir, True)
        pid = variants.server_pid()
        assert pid is not None and pid == server.pid
        context = RunContext(RunDir(run_dir), "run-soak", settings, loadgen_port=free_port(), cwd=tmp_path)
        done = steps.experiment("soak", served.load_target(), context, variants)
    assert done.problem is None and len(done.summaries) == 4

    ends = [e for e in iter_stage_events(run_dir / "stages.jsonl") if e.event == "stage_end"]
    assert [(e.experiment, e.status) for e in ends] == [("soak", "ok")] * 4
    assert all(e.client_rss_bytes is not None and e.client_rss_bytes > 0 for e in ends)
    assert all(e.client_trust in ("ok", "degraded", "saturated", None) for e in ends)
    measured = [r for r in iter_records(run_dir / "records.jsonl") if not r.warmup]
    assert measured and all(r.ok and r.experiment == "soak" for r in measured)
    per_slice = {e.stage_id: e.requests_done for e in ends}
    assert all(count and count > 0 for count in per_slice.values())  # every slice sent requests

    bad = BadLines("soak.jsonl")
    lines = read_soak_lines(run_dir / "soak.jsonl", bad)
    assert bad.count == 0
    events = [line.event for line in lines]
    assert events[0] == "soak_start" and events[-1] == "soak_end" and events.count("sample") >= 6
    start = lines[0]
    assert (start.memory_source, start.memory_missing, start.slices, start.users) == ("proc", None, 4, 2)
    samples = [line for line in lines if line.event == "sample"]
    assert all(not line.errors for line in samples), [line.errors for line in samples]
    assert all(line.server_rss_bytes is not None and line.server_rss_bytes > 10 * 2**20 for line in samples)
    assert all(line.kv_cells_total is not None and line.kv_cells_total > 0 for line in samples)
    assert any(line.kv_cells_used for line in samples)  # the slots hold the tokens they served

    paths = steps.report(run_dir, None)
    text = paths.markdown.read_text(encoding="utf-8")
    assert "## Soak" in text and "2 users held for" in text and "plots/soak.png" in text
    summary = json.loads((run_dir / "summary.json").read_text())
    (entry,) = summary["soak"]
    assert len(entry["slices"]) == 4 and entry["memory_source"] == "proc"
    assert all(row["server_rss_bytes"] > 10 * 2**20 for row in entry["slices"])
    fitted = [d for d in entry["drift"] if d["part"] == "all"]  # the first slice settles
    assert [(d["what"], d["points"]) for d in fitted] == [
        ("TTFT p99", 3), ("server memory", 3), ("load client memory", 3)
    ]  # fmt: skip
    assert all(d["slope_per_h"] is not None and d["beyond_noise"] is not None for d in fitted)
