"""The SLO limit the scheduler model predicts, with an interval from the cost curves' error.

Each level (closed-loop users, or an open-loop rate) is simulated with `simulator.simulate`; its
predicted TTFT and TPOT at the SLO's percentiles (quantload.stats, the same definition as the
measured ones) are set against the SLO's limits. The predicted limit is the highest level that
meets with every lower level meeting too. The interval runs the same levels, with the same seeds
(common random numbers), under the fastest and the slowest plausible cost: either a pair of
BatchCost or a pair of factors on `cost`. `limit_low` comes from the slowest cost and
`limit_high` from the fastest; nothing forces them around `limit`, so a model whose limit is not
monotone in its cost shows it rather than hides it.

Each level also says what share of a request's time the model spends queued, in prefill and in
decode, so that a report can set these beside the measured split and name the part it got wrong.

Given a level budget and the search's rules, each level is also judged as the load would judge it
(quantload.predict.search) and the limit search is run on those verdicts under each of the three
costs: what a search with these settings is predicted to show, beside what the server carries.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from quantload.load.limit_search import LimitResult
from quantload.predict.batch_cost import BatchCost
from quantload.predict.search import LevelBudget, LevelDecision, SearchRules, decide_level, predict_search
from quantload.predict.simulator import (
    LOCKSTEP,
    ClientTiming,
    ClosedLoop,
    OpenLoop,
    RequestRecord,
    ServerModel,
    ShapeSource,
    SimResult,
    ThinkTime,
    Workload,
    simulate,
)
from quantload.slo import PERCENTILES, Slo
from quantload.stats import percentile

LevelArrival = Literal["closed", "poisson"]


@dataclass(frozen=True)
class ScaledCost:
    """`cost` with every batch taking `factor` times as long."""

    cost: BatchCost
    factor: float

    def batch_s(self, prompt_tokens: int, decode_tokens: int, kv_tokens: int) -> float:
        return self.factor * self.cost.batch_s(prompt_tokens, decode_tokens, kv_tokens)


@dataclass(frozen=True)
class SimulatedLoad:
    """How every level is loaded: closed loop (level = users) or Poisson (level = requests/s),
    request shapes, requests per level (and a bound in simulated seconds), think time and the
    client's timing for closed loops, the first requests left out of the percentiles as warm-up,
    and, to judge each level as the load's decided stages do, their budget."""

    arrival: LevelArrival
    shapes: ShapeSource
    requests: int = 1000
    duration_s: float = math.inf
    think_s: float = 0.0
    think: ThinkTime = "constant"
    warmup_requests: int = 0
    client: ClientTiming = LOCKSTEP
    budget: LevelBudget | None = None

    def workload(self, level: float) -> Workload:
        """The workload of one level."""
        if self.arrival == "closed":
            users = int(level)
            if users != level or users < 1:
                raise ValueError(f"a closed-loop level is a whole number of users, not {level}")
            return ClosedLoop(
                users, self.shapes, self.requests, self.duration_s, self.think_s, self.think, self.client
            )
        return OpenLoop(float(level), self.shapes, self.requests, self.duration_s)


@dataclass(frozen=True)
class LevelPrediction:
    """One level as the model predicts it. `ttft_s`/`tpot_s` are at the SLO's percentiles (None
    without a request to take them from); the shares are per-request means of queue, prefill and
    decode time over end-to-end time (they add up to 1)."""

    level: float
    requests: int
    failed_frac: float
    ttft_s: float | None
    tpot_s: float | None
    ttft_p50_s: float | None
    tpot_p50_s: float | None
    throughput_rps: float
    output_tokens_per_s: float
    queue_share: float
    prefill_share: float
    decode_share: float
    meets: bool
    decision: LevelDecision | None = None


@dataclass(frozen=True)
class LimitPrediction:
    """The predicted limit (None: not even the lowest level meets) with its interval, and every
    level under the point cost, the slowest cost (`levels_low`) and the fastest (`levels_high`);
    given the search's rules, the limit search run on the levels' verdicts under the same three
    costs (`search`, `search_low`, `search_high`)."""

    slo: Slo
    arrival: LevelArrival
    limit: float | None
    limit_low: float | None
    limit_high: float | None
    levels: tuple[LevelPrediction, ...]
    levels_low: tuple[LevelPrediction, ...]
    levels_high: tuple[LevelPrediction, ...]
    search: LimitResult | None = None
    search_low: LimitResult | None = None
    search_high: LimitResult | None = None


def judge_level(
    level: float, result: SimResult, slo: Slo, warmup_requests: int = 0, budget: LevelBudget | None = None
) -> LevelPrediction:
    """A level's prediction from its simulation, leaving out the first `warmup_requests` sent;
    with a `budget` (closed loop), also its verdict as the load would reach it."""
    judged = result.records[warmup_requests:]
    ok = [record for record in judged if not record.failed]
    ttft_q = PERCENTILES[slo.ttft_percentile] * 100
    tpot_q = PERCENTILES[slo.tpot_percentile] * 100
    ttfts = [record.ttft_s for record in ok]
    tpots = [record.tpot_s for record in ok if record.tpot_s is not None]
    ttft = percentile(ttfts, ttft_q)
    tpot = percentile(tpots, tpot_q)
    failed_frac = (len(judged) - len(ok)) / len(judged) if judged else 0.0
    queue, prefill, decode = _shares(ok)
    span = _span_s(judged)
    meets = (
        bool(ok)
        and ttft is not None
        and ttft <= slo.ttft_s
        and (tpot is None or tpot <= slo.tpot_s)
        and failed_frac <= slo.max_failed_frac
    )
    decision = None if budget is None else decide_level(result, slo, int(level), budget, warmup_requests)
    return LevelPrediction(
        level=level,
        requests=len(judged),
        failed_frac=failed_frac,
        ttft_s=ttft,
        tpot_s=tpot,
        ttft_p50_s=percentile(ttfts, 50),
        tpot_p50_s=percentile(tpots, 50),
        throughput_rps=len(ok) / span if span > 0 else 0.0,
        output_tokens_per_s=sum(record.output_tokens for record in ok) / span if span > 0 else 0.0,
        queue_share=queue,
        prefill_share=prefill,
        decode_share=decode,
        meets=meets,
        decision=decision,
    )


def predict_levels(
    server: ServerModel,
    cost: BatchCost,
    slo: Slo,
    plan: SimulatedLoad,
    levels: Sequence[float],
    seed: int = 0,
    misses_past: int | None = None,
) -> tuple[LevelPrediction, ...]:
    """Every level simulated (each with the same `seed`) and judged, in ascending order; with
    `misses_past`, stopping once that many levels in a row have missed."""
    judged: list[LevelPrediction] = []
    missed = 0
    budget = plan.budget if plan.arrival == "closed" else None
    for level in sorted(levels):
        result = simulate(server, cost, plan.workload(level), seed)
        judged.append(judge_level(level, result, slo, plan.warmup_requests, budget))
        missed = 0 if judged[-1].meets else missed + 1
        if misses_past is not None and missed >= misses_past:
            break
    return tuple(judged)


def limit_of(levels: Sequence[LevelPrediction]) -> float | None:
    """The highest level that meets with every lower one meeting; None if the lowest misses."""
    limit: float | None = None
    for level in sorted(levels, key=lambda prediction: prediction.level):
        if not level.meets:
            break
        limit = level.level
    return limit


def predict_limit(
    server: ServerModel,
    cost: BatchCost,
    slo: Slo,
    plan: SimulatedLoad,
    levels: Sequence[float],
    *,
    cost_bounds: tuple[BatchCost, BatchCost] | None = None,
    scale_bounds: tuple[float, float] | None = None,
    seed: int = 0,
    misses_past: int | None = None,
    search: SearchRules | None = None,
) -> LimitPrediction:
    """The predicted SLO limit over `levels` (users 1..max_users, or rates), with its interval.

    `cost_bounds` is (fastest, slowest) BatchCost; `scale_bounds` is (low, high) factors on `cost`
    (0.9, 1.1 for ±10 %). Give one or neither (then the interval is the point). `misses_past`:
    each of the three sweeps stops once that many levels in a row have missed (levels above them
    cannot change the limit, which needs every lower level to meet). `search`: also run the limit
    search on the levels' verdicts (closed loop with a budget only); a level it asks for beyond
    the sweep is simulated then.
    """
    if cost_bounds is not None and scale_bounds is not None:
        raise ValueError("give cost_bounds or scale_bounds, not both")
    if search is not None and (plan.arrival != "closed" or plan.budget is None):
        raise ValueError("a predicted search needs closed-loop levels with a budget")
    if not levels:
        raise ValueError("no level to predict")
    if scale_bounds is not None:
        low_factor, high_factor = scale_bounds
        if not 0 < low_factor <= high_factor:
            raise ValueError(f"scale bounds must be 0 < low <= high: {scale_bounds}")
        cost_bounds = (ScaledCost(cost, low_factor), ScaledCost(cost, high_factor))
    point = predict_levels(server, cost, slo, plan, levels, seed, misses_past)
    if cost_bounds is None:
        fast = slow = point
    else:
        fast = predict_levels(server, cost_bounds[0], slo, plan, levels, seed, misses_past)
        slow = predict_levels(server, cost_bounds[1], slo, plan, levels, seed, misses_past)
    searches: tuple[LimitResult | None, ...] = (None, None, None)
    if search is not None:
        costs = (cost, *(cost_bounds or (cost, cost)))
        searches = tuple(
            _searched(server, one_cost, slo, plan, swept, search, seed)
            for one_cost, swept in zip(costs, (point, fast, slow), strict=True)
        )
    return LimitPrediction(
        slo=slo,
        arrival=plan.arrival,
        limit=limit_of(point),
        limit_low=limit_of(slow),
        limit_high=limit_of(fast),
        levels=point,
        levels_low=slow,
        levels_high=fast,
        search=searches[0],
        search_low=searches[2],
        search_high=searches[1],
    )


def _searched(
    server: ServerModel,
    cost: BatchCost,
    slo: Slo,
    plan: SimulatedLoad,
    swept: Sequence[LevelPrediction],
    rules: SearchRules,
    seed: int,
) -> LimitResult:
    """The search over the sweep's verdicts, simulating a level it asks for that the sweep left."""
    known = {int(level.level): level for level in swept}
    budget = plan.budget
    assert budget is not None

    def decide(users: int) -> LevelDecision:
        level = known.get(users)
        if level is None:
            result = simulate(server, cost, plan.workload(users), seed)
            level = known[users] = judge_level(users, result, slo, plan.warmup_requests, budget)
        assert level.decision is not None
        return level.decision

    return predict_search(decide, rules)


def _shares(records: Sequence[RequestRecord]) -> tuple[float, float, float]:
    """Mean shares of end-to-end time spent queued, in prefill and in decode."""
    queue = prefill = decode = 0.0
    counted = 0
    for record in records:
        e2e = record.e2e_s
        if e2e <= 0:
            continue
        queue += record.queue_s / e2e
        prefill += record.prefill_s / e2e
        decode += record.decode_s / e2e
        counted += 1
    if counted == 0:
        return 0.0, 0.0, 0.0
    return queue / counted, prefill / counted, decode / counted


def _span_s(records: Sequence[RequestRecord]) -> float:
    if not records:
        return 0.0
    return max(record.end_s for record in records) - min(record.arrival_s for record in records)
