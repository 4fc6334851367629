"""Successive halving as a state machine, driven by scripted limit ranges (no server): a
configuration is dropped only when another one of its rung beats it (met the SLO at a level it was
shown to miss), and a difference the data do not show is a tie."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from quantload.tune.halving import PlannedTrial, Score, SuccessiveHalving, plan_rungs
from quantload.tune.state_file import TuneLine

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
    """Each configuration meets up to its limit and is shown to miss one user above it."""

    def measure(trial: PlannedTrial) -> Score:
        found = table[trial.key]
        missed = (found or 0) + 1
        return Score(trial.key, trial.rung.index, found, (found or 0) / 10, missed, seconds)

    return measure


def test_rungs_shrink_by_eta_to_the_finalists_and_grow_longer() -> None:
    rungs = plan_rungs(8, eta=3, finalists=2, short_trial_s=60, final_cap_s=300)
    assert [(r.size, r.time_cap_s, r.final) for r in rungs] == [(8, 60, False), (3, 180, False), (2, 300, True)]
    assert [r.requests_frac for r in rungs] == pytest.approx([1 / 9, 1 / 3, 1.0])  # short trials are small too
    assert [r.size for r in plan_rungs(2, 3, 2, 60, 300)] == [2]  # no larger than the finalists: one rung
    assert plan_rungs(27, 3, 1, 10, 1000)[-1].size == 1
    assert [r.time_cap_s for r in plan_rungs(27, 3, 1, 10, 50)] == [10, 30, 50, 50]  # capped by the search's
    with pytest.raises(ValueError):
        plan_rungs(0, 3, 2, 60, 300)


def test_beaten_configurations_are_dropped_and_the_best_go_on() -> None:
    table: dict[str, float | None] = {"c0": 2, "c1": 4, "c2": None, "c3": 8, "c4": 6, "c5": 1, "c6": 7, "c7": 3}
    search = SuccessiveHalving(KEYS, plan_rungs(8, 3, 2, 60, 300), budget_s=1e9)
    asked = drive(search, limits(table))
    assert [t.key for t in asked if t.rung.index == 0] == list(KEYS)
    assert [t.key for t in asked if t.rung.index == 1] == ["c3"]  # c3 met 8 users, every other missed below
    assert [t.key for t in asked if t.rung.index == 2] == ["c3"]
    assert set(search.dropped(0)) == set(KEYS) - {"c3"}
    winner = search.winner()
    assert winner is not None and (winner.key, winner.rung) == ("c3", 2)
    ranked = [s.key for s in search.ranking()]
    assert ranked[0] == "c3" and ranked[-1] == "c2"  # never met: last


def test_configurations_the_data_cannot_separate_all_go_on_as_ties() -> None:
    def undecided(trial: PlannedTrial) -> Score:  # every configuration meets 2 and nothing misses
        return Score(trial.key, trial.rung.index, 2.0, 1.0 + int(trial.key[1]) / 10, None, 10.0)

    search = SuccessiveHalving(KEYS, plan_rungs(8, 3, 2, 60, 300), budget_s=1e9)
    asked = drive(search, undecided)
    assert search.dropped(0) == []
    assert [t.key for t in asked if t.rung.index == 1] == ["c7", "c6", "c5"]  # goodput orders the ties
    best = search.winner()
    assert best is not None and {s.key for s in search.tied_with(best)} == {"c6"}


def test_a_trial_that_did_not_run_is_beaten_by_any_that_did() -> None:
    search = SuccessiveHalving(("a", "b", "c"), plan_rungs(3, 3, 1, 60, 300), budget_s=1e9)
    scores = {
        "a": Score("a", 0, 4, 1.0, None),
        "b": Score("b", 0, 4, 2.5, None),
        "c": Score("c", 0, None, None, ran=False),
    }
    first = drive(
        search, lambda trial: scores[trial.key] if trial.rung.index == 0 else Score(trial.key, 1, 4, 2.0, None)
    )
    assert [t.key for t in first if t.rung.index == 1] == ["b"]
    assert search.dropped(0) == ["c"]
    assert [s.key for s in search.ranking()] == ["b", "a", "c"]


def test_the_budget_ends_the_search_and_the_best_of_the_highest_rung_reached_wins() -> None:
    def close(trial: PlannedTrial) -> Score:  # limits 0..7 with nothing shown to miss: no one is dropped
        n = int(trial.key[1])
        return Score(trial.key, trial.rung.index, float(n) if n else None, n / 10, None, 10.0)

    search = SuccessiveHalving(KEYS, plan_rungs(8, 3, 2, 60, 300), budget_s=95)
    asked = drive(search, close)  # ten trials of 10 s: the budget passes during rung 1
    assert len(asked) == 10 and not search.finished and search.out_of_budget
    winner = search.winner()
    assert winner is not None and winner.rung == 1 and winner.key == "c7"


def test_a_trial_the_budget_cut_short_does_not_stand_for_less_than_its_rung_before() -> None:
    # the case measured on two cores: the budget left 48 s of a final trial's 540 s, and the search
    # reached 2 users where the same configuration showed 10 a rung before
    search = SuccessiveHalving(("a", "b"), plan_rungs(2, 3, 1, 60, 300), budget_s=1e9)
    search.record(Score("a", 0, 10.0, 2.0, 12.0, 60.0))
    search.record(Score("b", 0, 8.0, 1.8, 9.0, 60.0))
    search.record(Score("a", 1, 2.0, 1.9, None, 48.0, cut_short=True))
    winner = search.winner()
    assert winner is not None and (winner.key, winner.rung, winner.limit) == ("a", 0, 10.0)
    # cut short but showing more than before, it stands
    more = SuccessiveHalving(("a", "b"), plan_rungs(2, 3, 1, 60, 300), budget_s=1e9)
    more.record(Score("a", 0, 4.0, 1.0, None, 60.0))
    more.record(Score("b", 0, 3.0, 0.9, None, 60.0))
    more.record(Score("a", 1, 6.0, 1.5, None, 48.0, cut_short=True))
    assert [(s.key, s.rung, s.limit) for s in more.ranking()] == [("a", 1, 6.0), ("b", 0, 3.0)]
    # a whole trial stands at its rung whatever it shows
    whole = SuccessiveHalving(("a", "b"), plan_rungs(2, 3, 1, 60, 300), budget_s=1e9)
    whole.record(Score("a", 0, 10.0, 2.0, 12.0, 60.0))
    whole.record(Score("b", 0, 8.0, 1.8, 9.0, 60.0))
    whole.record(Score("a", 1, 2.0, 1.9, 3.0, 300.0))
    best = whole.ranking()[0]
    assert (best.key, best.rung, best.limit) == ("a", 1, 2.0)
    # tune.jsonl keeps it, so a resumed tune ranks the same
    line = TuneLine(kind="trial", run_id="r", quant="Q", server="s", key="a", rung=1, limit=2.0, cut_short=True)
    assert TuneLine.from_json_line(line.model_dump_json(by_alias=True)).score().cut_short


def test_a_resumed_search_replays_its_trials_and_asks_for_the_rest() -> None:
    table: dict[str, float | None] = {key: float(n % 5) for n, key in enumerate(KEYS)}
    whole = SuccessiveHalving(KEYS, plan_rungs(8, 3, 2, 60, 300), budget_s=1e9)
    asked = drive(whole, limits(table))
    resumed = SuccessiveHalving(KEYS, plan_rungs(8, 3, 2, 60, 300), budget_s=1e9)
    for score in whole.scores[:9]:  # interrupted after nine trials
        resumed.record(score)
    rest = drive(resumed, limits(table))
    assert [(t.key, t.rung.index) for t in rest] == [(t.key, t.rung.index) for t in asked[9:]]
    assert resumed.winner() == whole.winner()
    early = SuccessiveHalving(KEYS, plan_rungs(8, 3, 2, 60, 300), 1e9)
    early.record(Score("c5", 0, 1, 1))  # any entrant of a decided rung, in any order (a resumed state)
    for twice_later_or_unknown in (Score("c5", 0, 1, 1), Score("c0", 1, 1, 1), Score("nope", 0, 1, 1)):
        with pytest.raises(ValueError, match="expected a trial of"):
            early.record(twice_later_or_unknown)
