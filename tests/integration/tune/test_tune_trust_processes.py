"""Tunes run against fake servers with real Locust processes: a speculating configuration that never
drafted and a configuration whose server died during its trial rank as not measured, never as
recommended or as missing the SLO; the budget bounds the baseline search too.

Moved from tests/unit/tune/test_tune_trust.py, whose other tests start no process.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from quantload.experiments.base import ExperimentContext, ServedVariant, ServerFlags
from quantload.llamacpp.server import free_port
from quantload.load.fakeserver import FakeServer
from quantload.rundir import TUNE_JSONL
from quantload.tune.outcome import ranking
from quantload.tune.search import tune_quant
from quantload.tune.state_file import read_tune
from tune_fakes import SCRIPT, TARGET, tune_context

pytestmark = pytest.mark.integration

MODEL = "tiny Q8_0-tiny.gguf sha256:0123456789abcdef"
SCRIPT_LEVEL_SLACK_S = 6.0  # one level of the fake under way when the budget runs out, Locust's start included


class RecordingVariants:
    """Variants of fake servers; `dead` slot counts get a server that is gone when the trial runs."""

    def __init__(self, dead: tuple[int, ...] = ()) -> None:
        self.asked: list[ServerFlags] = []
        self.dead = dead

    @contextlib.contextmanager
    def variant(self, flags: ServerFlags) -> Iterator[ServedVariant]:
        self.asked.append(flags)
        if flags.slots in self.dead:  # killed as the trial starts: nothing listens on its port
            url = f"http://127.0.0.1:{free_port()}"
            yield ServedVariant(TARGET.model_copy(update={"url": url}), flags, None, "no KV line", "")
            return
        with FakeServer(SCRIPT) as fake:
            yield ServedVariant(TARGET.model_copy(update={"url": fake.url}), flags, None, "no KV line", "")

    def adopt(self, flags: ServerFlags) -> ServedVariant:
        raise AssertionError("not here")


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
