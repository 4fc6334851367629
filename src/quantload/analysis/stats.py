"""The report's statistics beyond the percentile (quantload.stats): means, the median of repeats with
their range, relative differences."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from quantload.stats import finite

PERCENTILE_METHOD_TEXT = (
    "exact, from the raw per-request records: numpy.percentile(method='linear'), i.e. Hyndman & Fan "
    "type 7 (linear interpolation between the two nearest order statistics)"
)


def mean(values: Iterable[object]) -> float | None:
    """Arithmetic mean of the finite values; None when empty."""
    data = finite(values)
    return sum(data) / len(data) if data else None


@dataclass(frozen=True)
class Spread:
    """The median of per-repeat figures and their range."""

    median: float
    low: float
    high: float
    n: int

    def to_dict(self) -> dict[str, float | int]:
        return {"median": self.median, "min": self.low, "max": self.high, "repeats": self.n}


def spread(values: Iterable[object]) -> Spread | None:
    """Median, min and max of the finite values (one per repeat); None when there are none."""
    data = finite(values)
    if not data:
        return None
    return Spread(float(np.median(np.asarray(data))), min(data), max(data), len(data))


def relative_diff(value: float | None, reference: float | None) -> float | None:
    """(value - reference) / reference, None when either is missing or the reference is 0."""
    if value is None or reference is None or reference == 0:
        return None
    return (value - reference) / reference
