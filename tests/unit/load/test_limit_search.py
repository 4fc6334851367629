"""The limit search as a state machine, driven by scripted capacities (no server): every level is
decided once (meets, misses or undecided), so the limit rests on decided levels only."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from quantload.load.limit_search import LimitResult, LimitSearch, Trial, TrialOutcome


def drive(search: LimitSearch, outcome: Callable[[float], Trial], budget: int = 100) -> LimitResult:
    """Measure what the search asks until it is done."""
    for _ in range(budget):
        level = search.next_level()
        if level is None:
            return search.result()
        search.record(outcome(level))
    raise AssertionError(f"the search did not end in {budget} trials: {search.trials}")


def capacity(
    limit: float, undecided_above: float | None = None, seconds: float = 10.0
) -> Callable[[float], Trial]:
    """Levels up to `limit` meet; above it they miss, or stay undecided up to `undecided_above`."""

    def outcome(level: float) -> Trial:
        said: TrialOutcome = "meets" if level <= limit else "misses"
        if said == "misses" and undecided_above is not None and level <= undecided_above:
            said = "undecided"
        return Trial(level, said, seconds=seconds)

    return outcome


def test_users_grow_then_bisect_to_one_user() -> None:
    result = drive(LimitSearch("users", start=1, max_level=256), capacity(6))
    assert result.limit == 6 and result.ending == "found"
    assert result.lowest_miss == 7 and result.undecided == ()
    assert [t.level for t in result.trials] == [1, 2, 4, 8, 6, 7]
    assert "6 users met the SLO; misses from 7" in result.sentence()


def test_an_undecided_level_bounds_the_limit_and_the_search_probes_for_the_first_miss() -> None:
    result = drive(LimitSearch("users", start=1, max_level=64), capacity(3, undecided_above=9))
    assert result.limit == 3 and result.undecided == (4, 8) and result.lowest_miss == 16
    assert [t.level for t in result.trials] == [1, 2, 4, 3, 8, 16]
    assert "3 users met the SLO; undecided at 4, 8; misses from 16" in result.sentence()


def test_a_level_above_an_undecided_one_that_meets_is_no_capacity() -> None:
    def odd(level: float) -> Trial:
        return Trial(level, "undecided" if level == 2 else ("meets" if level <= 4 else "misses"))

    result = drive(LimitSearch("users", start=1, max_level=64), odd)
    assert result.limit == 1 and 2 in result.undecided


def test_a_hard_failure_misses_its_level_at_once() -> None:
    def hard(level: float) -> Trial:
        if level >= 8:
            return Trial(level, "misses", hard_failure=True, why="errors")
        return Trial(level, "meets")

    result = drive(LimitSearch("users", start=1, max_level=64), hard)
    assert [t.level for t in result.trials].count(8) == 1 and 16 not in [t.level for t in result.trials]
    assert result.limit == 7


def test_nothing_meets() -> None:
    result = drive(LimitSearch("users", start=1, max_level=64), capacity(0))
    assert result.limit is None and result.ending == "never_met" and result.lowest_miss == 1
    assert len(result.trials) == 1 and "no level was shown to meet the SLO" in result.sentence()


def test_nothing_decided_at_the_first_level_probes_upwards_for_a_miss() -> None:
    result = drive(LimitSearch("users", start=1, max_level=64), capacity(0, undecided_above=3))
    assert result.limit is None and result.undecided == (1, 2) and result.lowest_miss == 4


def test_the_ceiling_meets() -> None:
    result = drive(LimitSearch("users", start=1, max_level=8), capacity(100))
    assert result.limit == 8 and result.ending == "max_level"
    assert [t.level for t in result.trials] == [1, 2, 4, 8]


def test_rates_are_bisected_geometrically_to_the_resolution() -> None:
    result = drive(LimitSearch("rate_rps", start=0.5, max_level=64, resolution=0.1), capacity(3.3))
    assert result.limit is not None and 3.0 <= result.limit <= 3.3
    assert result.lowest_miss is not None and result.lowest_miss > 3.3
    assert (result.lowest_miss - result.limit) <= 0.1 * result.limit


def test_the_time_cap_ends_the_search_and_says_so() -> None:
    search = LimitSearch("users", start=1, max_level=256, time_cap_s=35)
    result = drive(search, capacity(6, seconds=10))
    assert result.ending == "capped" and len(result.trials) == 4
    assert result.limit == 4
    assert "when the time cap ended the search" in result.sentence()


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 9, 17, 31, 100, 255])
def test_every_scripted_capacity_is_found_exactly(limit: int) -> None:
    result = drive(LimitSearch("users", start=1, max_level=256), capacity(limit))
    assert result.limit == limit and result.lowest_miss == limit + 1


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        LimitSearch("users", start=0, max_level=8)
    with pytest.raises(ValueError):
        LimitSearch("users", start=1, max_level=8, growth=1.0)
