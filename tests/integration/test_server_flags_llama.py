"""The server-flag experiments and `quantload tune` on the tiny model against real llama-server.

The experiments run through the run's own steps on one F16 server (restarted in place per
variant): batching with -cb and -nocb, slots at a fixed KV budget (the same KV bytes at each -np,
as each server logged them), speculation off, with the n-gram type (which the tiny model's
random text never drafts from: that variant must fail as not speculating) and with a draft of the
same vocabulary (the tiny model at Q8_0: it must draft, and its counters say so). Then `quantload
tune` end to end on a two-configuration space, resumed, and refused in one line for a budget too
small. Assertions are on what the servers logged and the files say, never on how fast they were.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from quantload.analysis.run_data import load_run
from quantload.analysis.stage_tables import stage_table
from quantload.config import load_config
from quantload.errors import QuantloadError
from quantload.experiments.batching.tables import batching_table, batching_verdict
from quantload.experiments.slots.tables import slots_table
from quantload.experiments.speculation.tables import speculation_table, speculation_verdict
from quantload.experiments.variant_file import read_variants
from quantload.llamacpp.server import free_port
from quantload.llamacpp.toolchain import Toolchain
from quantload.load.records import iter_stage_events
from quantload.paths import cache_root
from quantload.run_context import RunContext
from quantload.rundir.handle import RunDir
from quantload.served import server_name
from quantload.slo import Slo
from quantload.stack.run_steps import RunSteps, Served
from support import run_quantload

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
# a median objective: a level is decided in a few requests, so the searches end within the ci profile
LOOSE_SLO = {
    "slo.ttft_s": 20.0, "slo.tpot_s": 5.0, "slo.ttft_percentile": "p50", "slo.tpot_percentile": "p50",
    "slo.max_failed_frac": 0.5, "slo.level_max_s": 30.0,
}  # fmt: skip


def test_batching_slots_and_speculation_on_the_tiny_model(
    toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    flags = {
        "model.source": "tiny",
        "run.profile": "ci",
        **LOOSE_SLO,
        "load.max_tokens": 8,
        "load.prompt_count": 4,
        "batching.users": 2,
        "batching.requests": 4,
        "slots.counts": [1, 2],
        "slots.kv_cells": 2048,
        "limit.max_users": 2,
        "limit.requests_per_user": 2,
        "limit.min_requests": 2,
        "speculation.users": 1,
        "speculation.requests": 2,
        "speculation.traffic": ["repeat"],
        "speculation.max_tokens": 16,
        "speculation.draft_model": str(tiny_models["Q8_0"]),
    }
    settings = load_config(tmp_path, {}, flags).settings
    steps = RunSteps(settings, os.environ, cache_root(None, os.environ))
    run_dir = tmp_path / "run"
    (run_dir / "logs").mkdir(parents=True)
    server = steps.server(toolchain, tiny_models["F16"], "tiny-F16", "F16", run_dir)
    failure: QuantloadError | None = None
    with server:
        served = Served("F16", server, name=server_name("F16"), model="tiny")
        variants = steps.server_variants(toolchain, served, run_dir, True)
        context = RunContext(RunDir(run_dir), "run-flags", settings, loadgen_port=free_port(), cwd=tmp_path)
        for name in ("batching", "slots"):
            done = steps.experiment(name, served.load_target(), context, variants)
            assert done.problem is None, name
        try:
            steps.experiment("speculation", served.load_target(), context, variants)
        except QuantloadError as error:
            failure = error
        assert server.alive() and server.spec.slots == settings.server.slots  # back as it was
    assert failure is not None and "measured 2 of 3 ways of speculating" in failure.problem
    assert "spec ngram default: not speculating: no draft token was counted" in failure.problem

    ends = [e for e in iter_stage_events(run_dir / "stages.jsonl") if e.event == "stage_end"]
    batching = [(e.server_args, e.phase, e.status) for e in ends if e.experiment == "batching"]
    assert batching == [
        ("-cb", "closed", "ok"),
        ("-cb", "poisson", "ok"),
        ("-nocb", "closed", "ok"),
        ("-nocb", "poisson", "ok"),
    ]
    launches = [line for line in server.log_path.read_text().splitlines() if line.startswith("$ ")]
    assert any(line.endswith(" -cb") for line in launches) and any(
        line.endswith(" -nocb") for line in launches
    )

    lines = {line.label: line for line in read_variants(run_dir)}
    one, two = lines["slots -np 1 -c 2048"], lines["slots -np 2 -c 2048"]
    assert one.kv is not None and two.kv is not None
    assert one.kv["predicted_bytes"] == two.kv["predicted_bytes"]  # the same KV cache at each -np
    assert (
        one.kv["reported_mib"] == two.kv["reported_mib"] == pytest.approx(one.kv["predicted_mib"], abs=0.005)
    )
    assert (one.kv["reported_n_ctx_slot"], two.kv["reported_n_ctx_slot"]) == (2048, 1024)
    draft = lines[f"spec draft {tiny_models['Q8_0'].stem}"].speculation
    assert draft is not None and draft.speculating and (draft.draft_tokens or 0) > 0
    assert draft.slots_speculative is True and draft.accepted_tokens is not None
    ngram = lines["spec ngram default"].speculation
    assert ngram is not None and not ngram.speculating

    run = load_run(run_dir)
    stages, variants = stage_table(run, Slo.of(settings.slo)), read_variants(run_dir)
    batching = batching_table(run.records, stages, ["F16"])
    assert set(batching["server_args"]) == {"-cb", "-nocb"}
    assert "static batching" in batching_verdict(batching)
    slots = slots_table(run.limits, variants, dict(run.summaries), run.records, ["F16"])
    assert list(slots["slots"]) == [1, 2] and slots["limit_users"].notna().all()
    speculation = speculation_table(run.records, stages, variants, ["F16"])
    spec = speculation.set_index("variant")
    assert spec.loc["spec off", "speculating"] is None
    assert spec.loc[f"spec draft {tiny_models['Q8_0'].stem}", "acceptance"] is not None
    assert spec.loc["spec ngram default", "speculating"] is False
    assert "not speculating, so not counted: spec ngram default" in speculation_verdict(speculation)


@pytest.mark.long  # a whole tune on the real server, a minute and more (the tune's logic: tests/unit/tune): `make test-long`
def test_quantload_tune_on_the_tiny_model_resumes_and_refuses_a_budget_too_small(
    toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    (tmp_path / "quantload.toml").write_text(
        "\n".join(
            [
                "[model]",
                'source = "tiny"',
                'quants = ["Q8_0"]',
                "[run]",
                'profile = "ci"',
                "[slo]",
                "ttft_s = 20.0",
                "tpot_s = 5.0",
                'ttft_percentile = "p50"',
                'tpot_percentile = "p50"',
                "max_failed_frac = 0.5",
                "level_max_s = 30.0",
                "[load]",
                "max_tokens = 8",
                "[limit]",
                "max_users = 2",
                "time_cap_s = 20",
                "requests_per_user = 2",
                "min_requests = 2",
                "[tune]",
                "slots = [2]",
                'batch_sizes = ["2048/512", "64/64"]',
                'cache_types = ["f16"]',
                "finalists = 1",
                "eta = 2",
                "short_trial_s = 10",
                "budget_s = 300",
            ]
        ),
        encoding="utf-8",
    )
    out = tmp_path / "results"
    small = run_quantload(["tune", "--out", str(out), "--budget", "5"], cwd=tmp_path)
    assert small.returncode == 2
    assert "tune.budget_s (5 s) is shorter than one trial" in small.stderr and not out.exists()

    done = run_quantload(["tune", "--out", str(out), "--json"], cwd=tmp_path, timeout_s=600)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)["Q8_0"]
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    kinds = [json.loads(line)["kind"] for line in (run_dir / "tune.jsonl").read_text().splitlines()]
    assert kinds == ["start", "trial", "trial", "trial", "baseline", "end"]
    against = result["against_baseline"]
    assert against is not None and result["cost"]["trials"] == 3 and result["ending"] == "done"
    assert against["best"] in {row["key"] for row in result["ranking"]}
    if result["winner"] is None:  # no configuration beat the configured flags by a decided margin
        assert "the configured flags are as good as any configuration tried" in against["sentence"]
        assert result["command"] is None and result["env"] == []
    else:
        assert result["winner"] == against["best"] and against["decided"]
        assert result["command"].startswith(str(toolchain.path("llama-server"))) and "-np 2" in result["command"]
        assert (
            result["env"] == ["QL_SLOTS=2", "QL_CTX_TOTAL=4096"] and "llama-q8-0:" in result["compose_override"]
        )
    assert all(row["memory_mib"] for row in result["ranking"])  # each variant's server reported its buffers

    again = run_quantload(
        ["tune", "--out", str(out), "--resume", str(run_dir), "--json"], cwd=tmp_path, timeout_s=300
    )
    assert again.returncode == 0, again.stderr[-2000:]
    assert json.loads(again.stdout)["Q8_0"]["winner"] == result["winner"]  # nothing left to measure
    kinds = [json.loads(line)["kind"] for line in (run_dir / "tune.jsonl").read_text().splitlines()]
    assert kinds.count("trial") == 3 and kinds.count("baseline") == 1

    report = run_quantload(["report", str(run_dir)], cwd=tmp_path)
    assert report.returncode == 0, report.stderr[-2000:]
    assert "## Tuned server flags" in (run_dir / "report.md").read_text()
