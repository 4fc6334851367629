"""Percentiles, medians of repeats and their range, checked against the textbook definitions."""

from __future__ import annotations

import math
import random

import pytest

from quantload.analysis.stats import mean, relative_diff, spread
from quantload.stats import PERCENTILE_METHOD, finite, percentile


def type7(values: list[float], q: float) -> float:
    """Hyndman & Fan type 7, written out: h = (n - 1) q; interpolate between floor and ceil."""
    ordered = sorted(values)
    h = (len(ordered) - 1) * q / 100
    low = math.floor(h)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (h - low) * (ordered[high] - ordered[low])


def inverted_cdf(values: list[float], q: float) -> float:
    """The smallest value whose empirical CDF reaches q: the ceil(q n)-th order statistic."""
    ordered = sorted(values)
    return ordered[max(math.ceil(q / 100 * len(ordered)) - 1, 0)]


@pytest.mark.parametrize("seed", range(5))
@pytest.mark.parametrize("q", [0, 1, 50, 90, 99, 99.9, 100])
def test_percentile_is_type_7(seed: int, q: float) -> None:
    rng = random.Random(seed)
    values = [rng.lognormvariate(-2, 1) for _ in range(rng.randrange(1, 300))]
    assert PERCENTILE_METHOD == "linear"
    assert percentile(values, q) == pytest.approx(type7(values, q), rel=1e-12)


@pytest.mark.parametrize("q", [1, 50, 99])
def test_inverted_cdf_is_an_order_statistic(q: float) -> None:
    values = [random.Random(q).random() for _ in range(37)]
    assert percentile(values, q, method="inverted_cdf") == inverted_cdf(values, q)


def test_missing_values_are_left_out_never_filled_in() -> None:
    assert percentile([], 50) is None
    assert percentile([None, float("nan")], 50) is None
    assert percentile([None, 3.0, float("nan"), 1.0, True], 50) == 2.0
    assert finite([1, None, "2", float("inf"), 2.5]) == [1.0, 2.5]
    assert mean([]) is None and mean([1, 2, None]) == 1.5


def test_spread_is_median_min_max_of_repeats() -> None:
    found = spread([0.3, 0.1, 0.2, None])
    assert found is not None
    assert (found.median, found.low, found.high, found.n) == (0.2, 0.1, 0.3, 3)
    two = spread([1.0, 2.0])
    assert two is not None and two.median == 1.5
    assert spread([None]) is None


def test_relative_diff() -> None:
    assert relative_diff(1.1, 1.0) == pytest.approx(0.1)
    assert relative_diff(None, 1.0) is None and relative_diff(1.0, 0.0) is None
