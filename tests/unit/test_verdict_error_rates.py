"""The verdict's error rates on a server of known tail, fixed seeds: the fake server's own slow
requests (quantload.load.fakeserver.SlowEpisodes) fed, in arrival order, to the level judgement the
load runs, until it decides or its budget ends. benchmarks/verdict_truth.py runs the full table."""

from __future__ import annotations

import random

from quantload.load.fakeserver import SlowEpisodes
from quantload.load.level_judgement import LevelJudgement
from quantload.slo import Slo


def decide(share: float, burst: int, users: int, budget: int, seed: int) -> str:
    level = LevelJudgement(Slo(1.0, 10.0), users, False, None, budget, 1e9)
    slow = SlowEpisodes(share, burst, random.Random(seed))
    outcome = "undecided"
    while level.requests < budget and outcome == "undecided":
        outcome = level.add(True, True, 2.0 if slow.next_is_slow() else 0.1, None, 0.01, 1.0)
    return outcome


def rates(share: float, burst: int, users: int, budget: int, runs: int) -> dict[str, int]:
    said = [decide(share, burst, users, budget, 1000 * burst + seed) for seed in range(runs)]
    return {outcome: said.count(outcome) for outcome in ("meets", "misses", "undecided")}


def test_a_level_over_its_allowance_is_almost_never_called_a_meet() -> None:
    for share, burst, users in ((0.015, 1, 1), (0.015, 4, 4), (0.03, 4, 4)):
        found = rates(share, burst, users, budget=1500, runs=40)
        assert found["meets"] <= 2, (share, burst, found)  # at most 5 % of 40


def test_a_level_well_within_its_allowance_is_called_a_meet() -> None:
    found = rates(0.001, 1, 1, budget=5000, runs=30)
    assert found["meets"] >= 24 and found["misses"] == 0, found  # at least 80 %


def test_a_clearly_broken_level_is_called_a_miss_quickly() -> None:
    level = LevelJudgement(Slo(1.0, 10.0), 4, False, None, 5000, 1e9)
    slow = SlowEpisodes(0.10, 4, random.Random(7))
    while level.outcome == "undecided":
        level.add(True, True, 2.0 if slow.next_is_slow() else 0.1, None, 0.01, 1.0)
    assert level.outcome == "misses" and level.requests < 600
