"""The limit search as a state machine, driven by scripted capacities (no server)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from quantload.load.limit_search import LimitResult, LimitSearch, Trial


def drive(search: LimitSearch, outcome: Callable[[float, int], Trial], budget: int = 100) -> LimitResult:
    """Measure what the search asks until it is done; `outcome(level, nth trial of it)`."""
    seen: dict[float, int] = {}
    for _ in range(budget):
        level = search.next_level()
        if level is None:
            return search.result()
        seen[level] = seen.get(level, 0) + 1
        search.record(outcome(level, seen[level]))
    raise AssertionError(f"the search did not end in {budget} trials: {search.trials}")


def capacity(limit: float, seconds: float = 10.0) -> Callable[[float, int], Trial]:
    return lambda level, nth: Trial(level, held=level <= limit, seconds=seconds)


def test_users_grow_then_bisect_to_one_user_and_confirm() -> None:
    result = drive(LimitSearch("users", start=1, max_level=256), capacity(6))
    assert result.limit == 6 and result.confirmed and result.ending == "found"
    assert result.lowest_broken == 7
    assert [t.level for t in result.trials] == [1, 2, 4, 8, 6, 7, 6]
    assert "6 users held the SLO in a majority of trials; 7 broke it" in result.sentence()


def test_a_level_that_held_once_but_not_in_a_majority_is_broken_after_all() -> None:
    def flaky(level: float, nth: int) -> Trial:
        if level == 6:
            return Trial(level, held=nth == 1)  # held the first time only
        return Trial(level, held=level <= 6)

    result = drive(LimitSearch("users", start=1, max_level=64), flaky)
    assert result.limit == 5 and result.confirmed
    assert result.lowest_broken == 6
    levels = [t.level for t in result.trials]
    assert levels.count(6) == 3 and levels.count(5) == 2


def test_a_hard_failure_breaks_its_level_without_repeats() -> None:
    def hard(level: float, nth: int) -> Trial:
        return Trial(level, held=level <= 4, hard_failure=level >= 8, why="errors" if level >= 8 else "")

    result = drive(LimitSearch("users", start=1, max_level=64), hard)
    assert [t.level for t in result.trials].count(8) == 1
    assert 16 not in [t.level for t in result.trials]
    assert result.limit == 4


def test_nothing_holds() -> None:
    result = drive(LimitSearch("users", start=1, max_level=64), capacity(0))
    assert result.limit is None and result.ending == "never_held"
    assert len(result.trials) == 1 and "not even the first" in result.sentence()


def test_the_ceiling_holds() -> None:
    result = drive(LimitSearch("users", start=1, max_level=8), capacity(100))
    assert result.limit == 8 and result.ending == "max_level"
    assert [t.level for t in result.trials] == [1, 2, 4, 8, 8]


def test_rates_are_bisected_geometrically_to_the_resolution() -> None:
    result = drive(LimitSearch("rate_rps", start=0.5, max_level=64, resolution=0.1), capacity(3.3))
    assert result.limit is not None and 3.0 <= result.limit <= 3.3 and result.confirmed
    assert result.lowest_broken is not None and result.lowest_broken > 3.3
    assert (result.lowest_broken - result.limit) <= 0.1 * result.limit


def test_the_time_cap_ends_the_search_and_says_so() -> None:
    search = LimitSearch("users", start=1, max_level=256, time_cap_s=35)
    result = drive(search, capacity(6, seconds=10))
    assert result.ending == "capped" and len(result.trials) == 4
    assert result.limit == 4 and not result.confirmed
    assert "not yet confirmed" in result.sentence()


@pytest.mark.parametrize("limit", [1, 2, 3, 5, 9, 17, 31, 100, 255])
def test_every_scripted_capacity_is_found_exactly(limit: int) -> None:
    result = drive(LimitSearch("users", start=1, max_level=256), capacity(limit))
    assert result.limit == limit and result.confirmed


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        LimitSearch("users", start=0, max_level=8)
    with pytest.raises(ValueError):
        LimitSearch("users", start=1, max_level=8, growth=1.0)
