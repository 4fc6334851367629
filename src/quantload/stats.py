"""Exact percentiles of raw values, for every part of quantload (load, report, calibration).

One definition, so a figure printed by `quantload load`, written to a stage summary and shown in a
report is the same number. Pure Python (the load processes call it per request and must not pay
for importing numpy); the results equal `numpy.percentile(values, q, method=...)` bit for bit
(tests/unit/test_stats.py checks it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from numbers import Real
from typing import Final, Literal

PercentileMethod = Literal["linear", "inverted_cdf"]
PERCENTILE_METHOD: Final[PercentileMethod] = "linear"  # Hyndman & Fan type 7


def finite(values: Iterable[object]) -> list[float]:
    """The values that are finite real numbers, as floats (None, NaN, booleans, text dropped)."""
    out: list[float] = []
    for value in values:
        if type(value) is float:  # the usual case first: the load path calls this per request
            if math.isfinite(value):
                out.append(value)
        elif isinstance(value, Real) and not isinstance(value, bool):
            number = float(value)
            if math.isfinite(number):
                out.append(number)
    return out


def percentile(
    values: Iterable[object], q: float, method: PercentileMethod = PERCENTILE_METHOD
) -> float | None:
    """The q-th percentile (0-100) of the finite values; None when there are none.

    "linear" interpolates between the two nearest order statistics; "inverted_cdf" takes the
    smallest value whose share of the sample reaches q (no interpolation).
    """
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q} is outside 0-100")
    ordered = sorted(finite(values))
    count = len(ordered)
    if count == 0:
        return None
    fraction = q / 100
    if method == "inverted_cdf":
        position = count * fraction - 1
        index = math.floor(position)
        if position != index:
            index += 1
        return ordered[min(max(index, 0), count - 1)]
    position = (count - 1) * fraction  # numpy's virtual index, computed in the same float steps
    if position >= count - 1:
        return ordered[-1]
    if position < 0:
        return ordered[0]
    low = math.floor(position)
    below, above = ordered[low], ordered[low + 1]
    weight = position - low
    step = above - below
    if weight >= 0.5:
        return above - step * (1 - weight)
    return below + step * weight


def percentile_interval(
    values: Iterable[object], q: float, confidence: float
) -> tuple[float | None, float | None]:
    """A distribution-free confidence interval of the q-th percentile (0-100) from order statistics.

    For n values and a true percentile ξ, the number of values below ξ is binomial(n, q/100), so the
    k-th smallest value lies below ξ with a probability that binomial gives exactly; the bounds are
    the order statistics whose chances of falling on the wrong side are each at most
    (1 - confidence) / 2. A side no order statistic can bound (too few values: a p99 of 100
    requests cannot be bounded above) is None. Raises nothing; (None, None) without values.
    """
    ordered = sorted(finite(values))
    count = len(ordered)
    if count == 0:
        return None, None
    from scipy.stats import binom  # imported where needed: the load processes never call this

    tail = (1.0 - confidence) / 2.0
    share = q / 100.0
    low_rank = int(binom.ppf(tail, count, share))  # P(fewer than low_rank below) <= tail
    high_rank = int(binom.ppf(1.0 - tail, count, share)) + 1
    low = ordered[low_rank - 1] if low_rank >= 1 else None
    high = ordered[high_rank - 1] if high_rank <= count else None
    return low, high
