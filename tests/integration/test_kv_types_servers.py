"""The kv_types experiment on the tiny model, through the run's own steps: the quantization's server
for f16, a variant per other cache type (q8_0, q4_0) with its KV check, one decode-heavy stage on
each; a server running alone is restarted in place and back, one beside others gets a second
llama-server, stopped afterwards; then the report's trade-off table of that run.

Assertions are on what the servers logged and the run files say, never on how fast they were.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from quantload.analysis.run_data import load_run
from quantload.analysis.stage_tables import stage_table
from quantload.config import load_config
from quantload.experiments.kv_types.tables import kv_type_table
from quantload.llamacpp.server import free_port
from quantload.llamacpp.toolchain import Toolchain
from quantload.load.records import iter_records, iter_stage_events
from quantload.paths import cache_root
from quantload.run_context import RunContext
from quantload.rundir.handle import RunDir
from quantload.served import server_name
from quantload.slo import Slo
from quantload.stack.run_steps import RunSteps, Served

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]
TYPES = ("f16", "q8_0", "q4_0")


@pytest.mark.parametrize("in_place", [True, False], ids=["alone", "beside-others"])
def test_every_cache_type_is_served_checked_and_loaded_then_stopped(
    toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path, in_place: bool
) -> None:
    flags = {
        "model.source": "tiny", "run.profile": "ci", "quality.kld_cache_types": list(TYPES),
        "kv_types.users": 2, "kv_types.requests": 4, "kv_types.max_tokens": 8,
    }  # fmt: skip
    settings = load_config(tmp_path, {}, flags).settings
    steps = RunSteps(settings, os.environ, cache_root(None, os.environ))
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    server = steps.server(toolchain, tiny_models["F16"], "tiny-F16", "F16", run_dir)
    with server:  # started on entering, stopped on leaving
        steps.check_kv(toolchain, server, "F16", run_dir)
        served = Served("F16", server, name=server_name("F16"), model="tiny")
        port = server.port
        variants = steps.server_variants(toolchain, served, run_dir, in_place)
        context = RunContext(RunDir(run_dir), "run-kv", settings, loadgen_port=free_port(), cwd=tmp_path)
        done = steps.experiment("kv_types", served.load_target(), context, variants)
        assert server.alive() and server.port == port  # the quantization's own server, as it was
        assert (server.spec.cache_type_k, server.spec.cache_type_v) == ("f16", "f16")
    assert done.problem is None and len(done.summaries) == 3

    ends = [e for e in iter_stage_events(run_dir / "stages.jsonl") if e.event == "stage_end"]
    assert [(e.kv_cache_type, e.status, e.requests_done) for e in ends] == [(t, "ok", 4) for t in TYPES]
    names = ["llama-f16"] * 3 if in_place else ["llama-f16", "llama-f16-kv-q8_0", "llama-f16-kv-q4_0"]
    assert [e.server for e in ends] == names
    measured = [r for r in iter_records(run_dir / "records.jsonl") if not r.warmup]
    assert len(measured) == 12 and all(r.ok and r.experiment == "kv_types" for r in measured)
    assert all(r.completion_tokens == 8 and r.ignore_eos and not r.cache_prompt for r in measured)

    kv = json.loads((run_dir / "kv.json").read_text())
    assert kv["results"]["F16"]["cache_type_v"] == "f16"
    for kind in ("q8_0", "q4_0"):
        entry = kv["cache_types"]["F16"][kind]
        assert (entry["cache_type_k"], entry["cache_type_v"]) == (kind, kind)
        assert entry["diff_pct"] == 0.0 and entry["reported_mib"] < kv["results"]["F16"]["reported_mib"]
        assert entry["flash_attn"] == "enabled"
    own = run_dir / "logs" / "llama-server-F16.log"
    launches = [line for line in own.read_text().splitlines() if line.startswith("$ ")]
    if in_place:  # restarted with each type, and back: a quantized V cache needs flash attention
        assert [("-ctv q8_0" in line, "-ctv q4_0" in line, "-fa on" in line) for line in launches] == [
            (False, False, False), (True, False, True), (False, False, False),
            (False, True, True), (False, False, False),
        ]  # fmt: skip
    else:
        assert len(launches) == 1
        for kind in ("q8_0", "q4_0"):
            log = (run_dir / "logs" / f"llama-server-F16-kv-{kind}.log").read_text()
            assert "-fa on" in log.splitlines()[0]
        for other in {r.url.rsplit(":", 1)[1] for r in measured if "-kv-" in r.server}:  # stopped
            with pytest.raises(OSError):
                socket.create_connection(("127.0.0.1", int(other)), timeout=1).close()

    run = load_run(run_dir)
    table = kv_type_table(run, stage_table(run, Slo(1.0, 0.1)), ["F16"]).set_index("cache_type")
    assert list(table.index) == list(TYPES)
    for kind in TYPES:
        row = table.loc[kind]
        assert row["kv_reported_mib"] == pytest.approx(row["kv_predicted_mib"], abs=0.005)
        assert row["output_tok_s"] > 0 and row["users"] == 2
    memory = [table.loc[kind, "kv_predicted_mib"] for kind in ("q4_0", "q8_0", "f16")]
    assert memory == sorted(memory) and len(set(memory)) == 3
