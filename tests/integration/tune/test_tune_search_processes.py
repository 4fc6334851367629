"""One quantization's tune against fake servers (one per configuration) and a fake ServerControl,
with real Locust processes: the trials it runs, tune.jsonl, resuming after an interruption, and
the budget.

Moved from tests/unit/tune/test_tune_search.py, whose other tests start no process.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantload.errors import ConfigError
from quantload.experiments.base import ExperimentContext
from quantload.llamacpp.server import ServerSpec
from quantload.load.fakeserver import FakeServer
from quantload.load.limit_file import read_limits
from quantload.rundir import TUNE_JSONL
from quantload.tune.outcome import quant_summary, ranking, search_cost
from quantload.tune.search import tune_quant
from quantload.tune.state_file import read_tune
from tune_fakes import SCRIPT, TARGET, RecordingVariants, tune_context

pytestmark = pytest.mark.integration


@pytest.mark.slow
def test_every_configuration_gets_a_short_trial_and_one_that_did_not_run_is_dropped(tmp_path: Path) -> None:
    run = tune_context(tmp_path, baseline=False)
    servers = RecordingVariants(broken=(4,))
    outcome = tune_quant(ExperimentContext(run, TARGET, servers))
    assert [(f.slots, f.label) for f in servers.asked] == [
        (2, "tune r0 np2 b2048/512 kv-f16 fa-auto t0 cb spec-none"),
        (4, "tune r0 np4 b2048/512 kv-f16 fa-auto t0 cb spec-none"),
        (2, "tune r1 np2 b2048/512 kv-f16 fa-auto t0 cb spec-none"),
    ]
    assert all(f.extra_args[:4] == ("-b", "2048", "-ub", "512") for f in servers.asked)
    lines = read_tune(tmp_path / TUNE_JSONL)
    assert [line.kind for line in lines] == ["start", "trial", "trial", "trial", "end"]
    broken = lines[2]
    assert not broken.ran and "did not become ready" in broken.why
    winner = outcome.winner
    assert winner is not None and winner.slots == 2 and outcome.ending == "done"
    assert lines[-1].winner == winner.key
    rows = ranking(outcome)
    assert [(r.rank, r.key.split()[0], r.rung, r.ran) for r in rows] == [
        (1, "np2", 1, True),
        (2, "np4", 0, False),
    ]
    assert rows[0].limit == 2 and rows[0].goodput_rps is not None
    searches = read_limits(tmp_path / "limits.jsonl")
    assert [line.variant for line in searches] == [servers.asked[0].label, servers.asked[2].label]
    cost = search_cost(outcome)
    assert cost.trials == 3 and cost.configs == 2 and cost.grid_seconds is not None
    spec = ServerSpec(model_path=Path("m.gguf"), alias="m-Q8_0", port=8080)
    summary = quant_summary(outcome, spec, run.settings, Path("/bin/llama-server"), 1000)
    assert "-np 2" in summary["command"] and summary["env"][0] == "QL_SLOTS=2"
    assert json.dumps(summary)  # tune.json holds it as JSON


@pytest.mark.slow
def test_an_interrupted_tune_resumes_where_it_stopped_and_refuses_another_space(tmp_path: Path) -> None:
    first = tune_context(tmp_path, baseline=False)
    tune_quant(ExperimentContext(first, TARGET, RecordingVariants()))
    state = tmp_path / TUNE_JSONL
    kept = state.read_text().splitlines()[:2]  # the start line and the first trial: interrupted there
    state.write_text("\n".join(kept) + "\n" + '{"kind": "tri', encoding="utf-8")  # and a torn line
    servers = RecordingVariants()
    outcome = tune_quant(ExperimentContext(first, TARGET, servers), resume_from=state)
    assert [f.label.split()[1:3] for f in servers.asked] == [
        ["r0", "np4"],
        ["r1", servers.asked[1].label.split()[2]],
    ]
    assert len(outcome.search.scores) == 3 and outcome.ending == "done"
    other = tune_context(tmp_path, baseline=False, slots=[2, 8])
    with pytest.raises(ConfigError, match="searched another model, space, workload or SLO"):
        tune_quant(ExperimentContext(other, TARGET, RecordingVariants()), resume_from=state)


@pytest.mark.slow
def test_the_budget_stops_the_trials_and_the_baseline_is_searched_as_the_finalists(tmp_path: Path) -> None:
    run = tune_context(tmp_path, budget_s=1.0, short_trial_s=0.5)
    with FakeServer(SCRIPT) as own:
        target = TARGET.model_copy(update={"url": own.url})
        outcome = tune_quant(ExperimentContext(run, target, RecordingVariants()))
    assert len(outcome.search.scores) == 1 and outcome.ending == "budget"  # one trial took the budget
    assert outcome.baseline is not None and outcome.baseline.label == "tune baseline"
    lines = read_tune(tmp_path / TUNE_JSONL)
    assert [line.kind for line in lines] == ["start", "trial", "baseline", "end"]
    assert lines[-1].ending == "budget"
