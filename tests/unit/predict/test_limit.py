"""The predicted SLO limit: hand-worked limits, monotone in the cost, and an interval around it."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from quantload.predict.limit import ScaledCost, SimulatedLoad, limit_of, predict_levels, predict_limit
from quantload.predict.simulator import FixedShape, RequestShape, SampledShapes, ServerModel
from quantload.slo import Slo


class DyadicCost:
    """1/64 s a batch, 1/1024 s a prompt token, `decode_s` a decode token (sums exact in floats)."""

    def __init__(self, decode_s: float = 0.0) -> None:
        self.decode_s = decode_s

    def batch_s(self, prompt_tokens: int, decode_tokens: int, kv_tokens: int) -> float:
        return 2**-6 + prompt_tokens * 2**-10 + decode_tokens * self.decode_s


SERVER = ServerModel(n_slots=8, ctx_per_slot_tokens=1024, n_batch_tokens=2048)
# identical requests from users that all start at 0: every round is the same, in lockstep
LOCKSTEP = SimulatedLoad("closed", FixedShape(RequestShape(100, 11)), requests=200)


def test_a_ttft_limit_worked_by_hand() -> None:
    # every round: one batch of U prompts (U * 100 / 1024 + 1/64 s), then 10 decode steps of 1/64 s
    slo = Slo(ttft_s=0.45, tpot_s=0.1)
    prediction = predict_limit(SERVER, DyadicCost(), slo, LOCKSTEP, range(1, 11), scale_bounds=(0.5, 2.0))
    assert [level.ttft_s for level in prediction.levels[:8]] == [u * 100 / 1024 + 1 / 64 for u in range(1, 9)]
    assert [level.meets for level in prediction.levels[:6]] == [True] * 4 + [False] * 2
    assert (prediction.limit_low, prediction.limit, prediction.limit_high) == (
        2,
        4,
        8,
    )  # 0.45 s: 2.1, 4.4, 8 slots
    four = prediction.levels[3]
    assert four.tpot_s == 1 / 64
    assert four.queue_share == 0.0
    assert four.prefill_share == pytest.approx(0.40625 / (0.40625 + 10 / 64), rel=1e-12)
    assert four.queue_share + four.prefill_share + four.decode_share == pytest.approx(1.0, rel=1e-12)
    assert four.requests == 200
    assert four.failed_frac == 0.0
    nine = prediction.levels[8]  # the ninth user waits a whole round for a slot
    assert nine.queue_share > 0.0 and not nine.meets


def test_a_tpot_limit_worked_by_hand() -> None:
    # U slots decode together: a step is 1/64 + U/128 s; TPOT 0.05 s holds up to U = 4
    slo = Slo(ttft_s=10.0, tpot_s=0.05)
    prediction = predict_limit(SERVER, DyadicCost(decode_s=2**-7), slo, LOCKSTEP, range(1, 9))
    assert [level.tpot_s for level in prediction.levels] == [1 / 64 + u / 128 for u in range(1, 9)]
    assert prediction.limit == prediction.limit_low == prediction.limit_high == 4
    assert prediction.levels_low == prediction.levels == prediction.levels_high


def test_the_limit_is_the_last_level_before_the_first_miss() -> None:
    slo = Slo(ttft_s=0.45, tpot_s=0.1)
    levels = list(predict_levels(SERVER, DyadicCost(), slo, LOCKSTEP, [1, 2, 3]))
    assert limit_of(levels) == 3

    assert limit_of([levels[0], replace(levels[1], meets=False), levels[2]]) == 1
    assert limit_of([replace(levels[0], meets=False), *levels[1:]]) is None


def test_failed_requests_over_the_allowance_miss_the_level() -> None:
    small = ServerModel(n_slots=8, ctx_per_slot_tokens=100, n_batch_tokens=2048)
    prediction = predict_limit(small, DyadicCost(), Slo(ttft_s=10.0, tpot_s=10.0), LOCKSTEP, [1, 2])
    assert prediction.levels[0].failed_frac == 1.0
    assert prediction.limit is None


def test_warm_up_requests_are_left_out() -> None:
    plan = SimulatedLoad("closed", FixedShape(RequestShape(100, 11)), requests=200, warmup_requests=20)
    (level,) = predict_levels(SERVER, DyadicCost(), Slo(ttft_s=1.0, tpot_s=1.0), plan, [2])
    assert level.requests == 180


def random_shapes() -> SampledShapes:
    rng = np.random.default_rng(2)
    pairs = zip(rng.integers(20, 700, 80), rng.integers(4, 120, 80), strict=True)
    return SampledShapes(tuple(RequestShape(int(p), int(o)) for p, o in pairs))


class SlopedCost:
    def batch_s(self, prompt_tokens: int, decode_tokens: int, kv_tokens: int) -> float:
        return 0.012 + 8e-5 * prompt_tokens + 6e-4 * decode_tokens + 2e-7 * kv_tokens


def test_the_limit_falls_as_the_cost_grows() -> None:
    server = ServerModel(n_slots=8, ctx_per_slot_tokens=1024, n_batch_tokens=256)
    plan = SimulatedLoad("closed", random_shapes(), requests=300, warmup_requests=16)
    slo = Slo(ttft_s=0.5, tpot_s=0.03, ttft_percentile="p95", tpot_percentile="p95")
    limits: list[float] = []
    for scale in (0.5, 0.7, 1.0, 1.4, 2.0):
        limit = predict_limit(server, ScaledCost(SlopedCost(), scale), slo, plan, range(1, 17)).limit
        assert limit is not None
        limits.append(limit)
    assert limits == sorted(limits, reverse=True)
    assert limits[0] > limits[-1]


def test_the_interval_brackets_the_point_estimate() -> None:
    server = ServerModel(n_slots=4, ctx_per_slot_tokens=1024, n_batch_tokens=512)
    plan = SimulatedLoad("poisson", random_shapes(), requests=400, warmup_requests=20)
    slo = Slo(ttft_s=0.4, tpot_s=0.03, ttft_percentile="p90", tpot_percentile="p90")
    rates = [0.25 * step for step in range(1, 21)]
    prediction = predict_limit(server, SlopedCost(), slo, plan, rates, scale_bounds=(0.8, 1.25), seed=4)
    low, point, high = prediction.limit_low, prediction.limit, prediction.limit_high
    assert low is not None and point is not None and high is not None
    assert low <= point <= high
    assert low < high
    assert prediction.arrival == "poisson"
    assert [level.level for level in prediction.levels_low] == rates


def test_a_pair_of_costs_is_the_same_interval_as_factors_on_the_cost() -> None:
    slo = Slo(ttft_s=0.45, tpot_s=0.1)
    by_scale = predict_limit(SERVER, DyadicCost(), slo, LOCKSTEP, range(1, 10), scale_bounds=(0.5, 2.0))
    pair = (ScaledCost(DyadicCost(), 0.5), ScaledCost(DyadicCost(), 2.0))
    by_pair = predict_limit(SERVER, DyadicCost(), slo, LOCKSTEP, range(1, 10), cost_bounds=pair)
    assert by_pair == by_scale


def test_bounds_are_one_kind_or_none() -> None:
    with pytest.raises(ValueError, match="not both"):
        predict_limit(
            SERVER,
            DyadicCost(),
            Slo(1.0, 1.0),
            LOCKSTEP,
            [1],
            cost_bounds=(DyadicCost(), DyadicCost()),
            scale_bounds=(1, 1),
        )
    with pytest.raises(ValueError, match="whole number"):
        predict_limit(SERVER, DyadicCost(), Slo(1.0, 1.0), LOCKSTEP, [1.5])
