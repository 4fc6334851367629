"""The limit search run on simulated levels: each level judged as the load judges it, within its
budget, and the search's own state machine over those verdicts."""

from __future__ import annotations

import pytest

from quantload.predict.limit import SimulatedLoad, predict_limit
from quantload.predict.search import (
    SIMULATION_ENDED,
    LevelBudget,
    LevelDecision,
    SearchRules,
    decide_level,
    predict_search,
)
from quantload.predict.simulator import FixedShape, RequestShape, ServerModel, simulate
from quantload.slo import Slo


class DyadicCost:
    """1/64 s a batch and 1/1024 s a prompt token: sums exact in floats."""

    def batch_s(self, prompt_tokens: int, decode_tokens: int, kv_tokens: int) -> float:
        return 2**-6 + prompt_tokens * 2**-10


SERVER = ServerModel(n_slots=8, ctx_per_slot_tokens=1024, n_batch_tokens=2048)
SHAPE = FixedShape(RequestShape(100, 11))
# one user: a prompt batch (1/64 + 100/1024 s), then 10 decode steps of 1/64 s, then the next request
REQUEST_S = 2**-6 + 100 * 2**-10 + 10 * 2**-6
SLO = Slo(ttft_s=0.45, tpot_s=0.1, ttft_percentile="p90", tpot_percentile="p90", max_failed_frac=0.1)
PLENTY = LevelBudget(max_s=1000.0, max_requests=10_000)


def one_user(requests: int = 400) -> SimulatedLoad:
    return SimulatedLoad("closed", SHAPE, requests=requests)


def test_one_user_meets_on_the_fewest_requests_the_slo_allows_and_takes_their_time() -> None:
    result = simulate(SERVER, DyadicCost(), one_user().workload(1))
    decided = decide_level(result, SLO, 1, PLENTY)
    # none over, none failed, a request a burst: what the anytime-valid evidence needs at p90 and 10 %
    fewest = SLO.fewest_requests()
    assert fewest == 37
    assert decided == LevelDecision("meets", fewest * REQUEST_S, fewest)


def test_a_level_still_sends_its_planned_requests_once_decided() -> None:
    result = simulate(SERVER, DyadicCost(), one_user().workload(1))
    decided = decide_level(result, SLO, 1, LevelBudget(1000.0, 10_000, planned_per_user=50))
    assert decided == LevelDecision("meets", 50 * REQUEST_S, 50)


def test_a_level_out_of_seconds_is_undecided_on_what_it_sent_in_time() -> None:
    result = simulate(SERVER, DyadicCost(), one_user().workload(1))
    # 10 requests' worth of seconds: the 10th is sent at 9 x REQUEST_S, the 11th at 10 x, too late
    decided = decide_level(result, SLO, 1, LevelBudget(max_s=10 * REQUEST_S, max_requests=10_000))
    assert decided == LevelDecision("undecided", 10 * REQUEST_S, 10)
    by_count = decide_level(result, SLO, 1, LevelBudget(max_s=1000.0, max_requests=12))
    assert by_count == LevelDecision("undecided", 12 * REQUEST_S, 12)


def test_a_level_whose_simulation_ends_first_says_so() -> None:
    result = simulate(SERVER, DyadicCost(), one_user(requests=20).workload(1))
    decided = decide_level(result, SLO, 1, PLENTY)  # 20 requests, where meeting needs 37
    assert decided == LevelDecision("undecided", 20 * REQUEST_S, 20, SIMULATION_ENDED)
    spent = decide_level(result, SLO, 1, LevelBudget(max_s=5 * REQUEST_S, max_requests=10_000))
    assert spent.why == ""  # its budget, not the simulation, ended it


def test_a_level_over_its_limit_misses_after_a_few_requests() -> None:
    result = simulate(SERVER, DyadicCost(), one_user().workload(1))
    tight = Slo(ttft_s=0.05, tpot_s=0.1, ttft_percentile="p90", tpot_percentile="p90", max_failed_frac=0.1)
    decided = decide_level(result, tight, 1, PLENTY)  # every TTFT is 0.113 s
    assert decided.outcome == "misses"
    assert 2 <= decided.requests <= 5
    assert decided.seconds == decided.requests * REQUEST_S


def test_more_users_need_more_requests_to_meet_as_their_overs_may_come_in_bursts() -> None:
    load = SimulatedLoad("closed", SHAPE, requests=800)
    one = decide_level(simulate(SERVER, DyadicCost(), load.workload(1)), SLO, 1, PLENTY)
    four = decide_level(simulate(SERVER, DyadicCost(), load.workload(4)), SLO, 4, PLENTY)
    assert one.outcome == four.outcome == "meets"
    assert four.requests >= 3 * one.requests


def test_the_search_runs_its_own_rules_on_the_levels_verdicts() -> None:
    def decide(users: int) -> LevelDecision:
        outcome = "meets" if users <= 5 else "undecided" if users <= 7 else "misses"
        return LevelDecision(outcome, 10.0, 100)

    found = predict_search(decide, SearchRules(start_users=1, max_users=64, growth=2.0, time_cap_s=3600))
    assert [trial.level for trial in found.trials] == [1, 2, 4, 8, 6, 5]
    assert (found.limit, found.lowest_miss, found.undecided, found.ending) == (5, 8, (6,), "found")
    assert found.seconds == 60.0
    capped = predict_search(decide, SearchRules(1, 64, 2.0, time_cap_s=35))
    assert (capped.limit, capped.ending, len(capped.trials)) == (4, "capped", 4)


def test_a_predicted_limit_carries_the_search_under_each_cost() -> None:
    load = SimulatedLoad("closed", SHAPE, requests=300, budget=LevelBudget(max_s=60.0, max_requests=10_000))
    rules = SearchRules(1, 16, 2.0, 3600)
    found = predict_limit(SERVER, DyadicCost(), SLO, load, range(1, 11), scale_bounds=(0.5, 2.0), search=rules)
    assert found.search is not None and found.search_low is not None and found.search_high is not None
    assert all(level.decision is not None for level in found.levels)
    # the slowest cost shows no more than the point, the fastest no less
    limits = [result.limit or 0 for result in (found.search_low, found.search, found.search_high)]
    assert limits == sorted(limits)
    # a search never shows more than the percentiles carry
    assert found.search.limit is not None and found.limit is not None and found.search.limit <= found.limit
    with pytest.raises(ValueError, match="closed-loop levels with a budget"):
        predict_limit(SERVER, DyadicCost(), SLO, SimulatedLoad("closed", SHAPE), [1, 2], search=rules)
    poisson = SimulatedLoad("poisson", SHAPE, budget=PLENTY)
    with pytest.raises(ValueError, match="closed-loop levels with a budget"):
        predict_limit(SERVER, DyadicCost(), SLO, poisson, [1.0, 2.0], search=rules)
