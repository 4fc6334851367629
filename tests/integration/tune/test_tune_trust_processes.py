"""Tunes run against fake servers with real Locust processes: a speculating configuration that never
drafted and a configuration whose server died during its trial rank as not measured, never as
recommended or as missing the SLO; the budget bounds the baseline search too; a resumed state's
damaged trial lines are counted, named and measured again, never a traceback.

Moved from tests/unit/tune/test_tune_trust.py, whose other tests start no process.
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from quantload.experiments.base import ExperimentContext
from quantload.load.fakeserver import FakeServer
from quantload.rundir import TUNE_JSONL
from quantload.tune.outcome import ranking
from quantload.tune.search import tune_quant
from quantload.tune.state_file import read_tune
from tune_fakes import MODEL, SCRIPT, TARGET, RecordingVariants, finished_state, tune_context

pytestmark = pytest.mark.integration

# one level of the fake under way when the budget runs out, Locust's start included
SCRIPT_LEVEL_SLACK_S = 6.0


@pytest.mark.slow
def test_a_variant_that_never_drafted_or_whose_server_died_is_not_ranked_as_measured(tmp_path: Path) -> None:
    run = tune_context(tmp_path, baseline=False, slots=[2, 4], speculation=["ngram"], finalists=2)
    servers = RecordingVariants(dead=(4,))
    outcome = tune_quant(ExperimentContext(run, TARGET, servers), model=MODEL)
    rows = {row.key.split()[0]: row for row in ranking(outcome)}
    assert not rows["np2"].ran and "not speculating: no draft token was counted" in rows["np2"].why
    assert not rows["np4"].ran and "stopped answering during the trial" in rows["np4"].why
    assert outcome.winner is None  # the fake never drafts: nothing to recommend
    lines = read_tune(tmp_path / TUNE_JSONL)
    assert [line.ran for line in lines if line.kind == "trial"] == [False, False]


@pytest.mark.slow
def test_the_budget_bounds_the_baseline_search_too(tmp_path: Path) -> None:
    run = tune_context(tmp_path, budget_s=6.0, short_trial_s=2.0, finalists=1)
    wide = run.settings.model_copy(
        update={"limit": run.settings.limit.model_copy(update={"max_users": 64, "time_cap_s": 3600.0})}
    )
    run = dataclasses.replace(run, settings=wide)
    started = time.monotonic()
    with FakeServer(SCRIPT) as own:
        target = TARGET.model_copy(update={"url": own.url})
        outcome = tune_quant(ExperimentContext(run, target, RecordingVariants()), model=MODEL)
    assert outcome.baseline is not None and outcome.baseline.ran
    # the baseline keeps its share of the budget, not the limit search's hour: a few levels at most
    assert outcome.baseline.seconds < 6.0 + SCRIPT_LEVEL_SLACK_S
    assert time.monotonic() - started < 2 * 6.0 + 2 * SCRIPT_LEVEL_SLACK_S


def test_damaged_trial_lines_are_counted_named_and_measured_again_not_a_traceback(tmp_path: Path) -> None:
    state, lines = finished_state(tmp_path)
    first_trial = json.loads(lines[1])
    no_key = json.dumps({**first_trial, "key": None})
    unknown = json.dumps({**first_trial, "key": "np99 b1/1 kv-f16 fa-auto t0 cb spec-none"})
    damaged = [lines[0], no_key, '{"kind": "trial", "rung": "x"', unknown, *lines[2:]]
    state.write_text("\n".join(damaged) + "\n", encoding="utf-8")
    warned: list[str] = []
    run = dataclasses.replace(tune_context(tmp_path, baseline=False), warn=warned.append)
    servers = RecordingVariants()
    outcome = tune_quant(ExperimentContext(run, TARGET, servers), resume_from=state, model=MODEL)
    assert [flags.label.split()[1:3] for flags in servers.asked] == [["r0", "np2"]]  # measured again
    assert len(outcome.search.scores) == 3
    joined = " ".join(warned)
    assert "2 lines of tune.jsonl could not be read" in joined and "lines 2, 3" in joined
    assert "1 trial line(s) of tune.jsonl do not fit this search" in joined and "np99" in joined
    assert outcome.notes and all("\n" not in note for note in outcome.notes)
