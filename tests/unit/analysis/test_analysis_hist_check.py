"""Which bucket Prometheus' histogram_quantile places a quantile in, against the raw order statistic."""

from __future__ import annotations

import bisect
import math
import random

import pytest

from quantload.analysis.prometheus_tables import bucket_of
from quantload.load.metrics import BUCKETS_S
from quantload.stats import percentile


def cumulative(values: list[float]) -> list[tuple[float, float]]:
    """The load generator's buckets (le) as cumulative counts, +Inf last."""
    counts = [0] * (len(BUCKETS_S) + 1)
    for value in values:
        counts[bisect.bisect_left(BUCKETS_S, value)] += 1
    running, out = 0, []
    for bound, count in zip([*BUCKETS_S, math.inf], counts, strict=True):
        running += count
        out.append((bound, float(running)))
    return out


@pytest.mark.parametrize("seed", range(20))
@pytest.mark.parametrize("q", [0.5, 0.9, 0.99])
def test_the_order_statistic_lies_in_the_bucket(seed: int, q: float) -> None:
    rng = random.Random(seed)
    values = [rng.lognormvariate(-2.5, 1.0) for _ in range(rng.randrange(1, 400))]
    bucket = bucket_of(cumulative(values), q)
    assert bucket is not None
    picked = percentile(values, q * 100, method="inverted_cdf")
    assert picked is not None and bucket[0] <= picked <= bucket[1]


def test_empty_histogram_has_no_bucket() -> None:
    assert bucket_of([], 0.5) is None
    assert bucket_of([(0.1, 0.0), (math.inf, 0.0)], 0.5) is None
