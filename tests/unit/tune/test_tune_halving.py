"""Successive halving as a state machine, driven by scripted limits (no server)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from quantload.tune.halving import PlannedTrial, Score, SuccessiveHalving, plan_rungs

KEYS = tuple(f"c{n}" for n in range(8))


def drive(search: SuccessiveHalving, measure: Callable[[PlannedTrial], Score]) -> list[PlannedTrial]:
    asked = []
    for _ in range(100):
        trial = search.next_trial()
        if trial is None:
            return asked
        asked.append(trial)
        search.record(measure(trial))
    raise AssertionError("the search did not end")


def limits(table: dict[str, float | None], seconds: float = 10.0) -> Callable[[PlannedTrial], Score]:
    def measure(trial: PlannedTrial) -> Score:
        found = table[trial.key]
        return Score(trial.key, trial.rung.index, found, (found or 0) / 10, trial.rung.final, seconds)

    return measure


def test_rungs_shrink_by_eta_to_the_finalists_and_grow_longer() -> None:
    rungs = plan_rungs(8, eta=3, finalists=2, short_trial_s=60, final_cap_s=300, confirm_repeats=3)
    assert [(r.size, r.time_cap_s, r.repeats, r.final) for r in rungs] == [
        (8, 60, 1, False),
        (3, 180, 1, False),
        (2, 300, 3, True),
    ]
    assert [r.requests_frac for r in rungs] == pytest.approx([1 / 9, 1 / 3, 1.0])  # short trials are small too
    assert [r.size for r in plan_rungs(2, 3, 2, 60, 300, 3)] == [2]  # no larger than the finalists: one rung
    assert plan_rungs(27, 3, 1, 10, 1000, 2)[-1].size == 1
    assert [r.time_cap_s for r in plan_rungs(27, 3, 1, 10, 50, 2)] == [
        10,
        30,
        50,
        50,
    ]  # capped by the search's own
    with pytest.raises(ValueError):
        plan_rungs(0, 3, 2, 60, 300, 3)


def test_the_best_third_is_promoted_each_rung_and_the_winner_is_the_best_finalist() -> None:
    table: dict[str, float | None] = {
        "c0": 2,
        "c1": 4,
        "c2": None,
        "c3": 8,
        "c4": 6,
        "c5": 1,
        "c6": 7,
        "c7": 3,
    }
    search = SuccessiveHalving(KEYS, plan_rungs(8, 3, 2, 60, 300, 3), budget_s=1e9)
    asked = drive(search, limits(table))
    assert [t.key for t in asked if t.rung.index == 0] == list(KEYS)
    assert [t.key for t in asked if t.rung.index == 1] == ["c3", "c6", "c4"]
    assert [t.key for t in asked if t.rung.index == 2] == ["c3", "c6"]
    assert search.finished and len(asked) == search.planned_trials == 13
    winner = search.winner()
    assert winner is not None and (winner.key, winner.rung) == ("c3", 2)
    ranked = [s.key for s in search.ranking()]
    assert ranked[:3] == ["c3", "c6", "c4"] and ranked[-1] == "c2"  # never held: last


def test_goodput_breaks_a_tie_and_a_trial_that_did_not_run_ranks_last() -> None:
    search = SuccessiveHalving(("a", "b", "c"), plan_rungs(3, 3, 1, 60, 300, 1), budget_s=1e9)
    scores = {
        "a": Score("a", 0, 4, 1.0),
        "b": Score("b", 0, 4, 2.5),
        "c": Score("c", 0, None, None, ran=False),
    }
    first = drive(
        search, lambda trial: scores[trial.key] if trial.rung.index == 0 else Score(trial.key, 1, 4, 2.0)
    )
    assert [t.key for t in first if t.rung.index == 1] == ["b"]
    assert [s.key for s in search.ranking()] == ["b", "a", "c"]


def test_the_budget_ends_the_search_and_the_best_of_the_highest_rung_reached_wins() -> None:
    table: dict[str, float | None] = {key: float(n) for n, key in enumerate(KEYS)}
    search = SuccessiveHalving(KEYS, plan_rungs(8, 3, 2, 60, 300, 3), budget_s=95)
    asked = drive(search, limits(table, seconds=10))  # ten trials of 10 s: the budget passes during rung 1
    assert len(asked) == 10 and not search.finished and search.out_of_budget
    winner = search.winner()
    assert winner is not None and winner.rung == 1 and winner.key == "c7"


def test_a_resumed_search_replays_its_trials_and_asks_for_the_rest() -> None:
    table: dict[str, float | None] = {key: float(n % 5) for n, key in enumerate(KEYS)}
    whole = SuccessiveHalving(KEYS, plan_rungs(8, 3, 2, 60, 300, 3), budget_s=1e9)
    asked = drive(whole, limits(table))
    resumed = SuccessiveHalving(KEYS, plan_rungs(8, 3, 2, 60, 300, 3), budget_s=1e9)
    for score in whole.scores[:9]:  # interrupted after nine trials
        resumed.record(score)
    rest = drive(resumed, limits(table))
    assert [(t.key, t.rung.index) for t in rest] == [(t.key, t.rung.index) for t in asked[9:]]
    assert resumed.winner() == whole.winner()
    with pytest.raises(ValueError, match="expected a trial of"):
        SuccessiveHalving(KEYS, plan_rungs(8, 3, 2, 60, 300, 3), 1e9).record(Score("c5", 0, 1, 1))
