"""Drift over time: how fast a series moves per hour, and whether that is beyond its noise.

A least-squares line through (hours since the first point, value), by scipy.stats.linregress: its
slope per hour, the slope's standard error, the 95 % interval (slope ± t(0.975, n-2) x standard
error) and the two-sided p-value of "no slope". A drift is beyond noise when that interval leaves
out zero (p < 0.05). With fewer than MIN_POINTS points there is no verdict.

The points are a soak's slices, one value each (a slice's TTFT p99, the median of the memory
readings inside it), not the raw readings: readings seconds apart are not independent, and fitting
them one by one would make the interval look far narrower than the data allow. Slices still
follow each other, so the interval is read as a screen (is there a trend worth looking at), not as
an exact probability.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from scipy import stats as scipy_stats

MIN_POINTS = 3
CONFIDENCE = 0.95
SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class Drift:
    """The slope per hour of one series and what it says (units: the series' own per hour)."""

    what: str
    part: str  # which points were fitted, in words ("after the first slice", "second half")
    points: int
    hours: float | None  # from the first point fitted to the last
    mean: float | None
    slope_per_h: float | None
    stderr_per_h: float | None
    ci_low_per_h: float | None
    ci_high_per_h: float | None
    p_value: float | None
    beyond_noise: bool | None  # None: too few points to say

    @property
    def relative_per_h(self) -> float | None:
        """The slope as a share of the series' mean, per hour."""
        if self.slope_per_h is None or not self.mean:
            return None
        return self.slope_per_h / self.mean

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "relative_per_h": self.relative_per_h}


def fit_drift(
    what: str, times_unix_s: Sequence[float], values: Sequence[float | None], part: str = "all"
) -> Drift:
    """The drift of `values` (None and NaN left out) against their times (see the module docstring)."""
    pairs = [
        (float(t), float(v))
        for t, v in zip(times_unix_s, values, strict=True)
        if v is not None and math.isfinite(float(v)) and math.isfinite(float(t))
    ]
    mean = float(np.mean([v for _, v in pairs])) if pairs else None
    if len(pairs) < MIN_POINTS:
        return Drift(what, part, len(pairs), None, mean, None, None, None, None, None, None)
    start = min(t for t, _ in pairs)
    hours = np.array([(t - start) / SECONDS_PER_HOUR for t, _ in pairs])
    ys = np.array([v for _, v in pairs])
    span = float(hours.max() - hours.min())
    if span <= 0:
        return Drift(what, part, len(pairs), 0.0, mean, None, None, None, None, None, None)
    if float(ys.max() - ys.min()) == 0.0:  # a flat line: no slope, no noise
        return Drift(what, part, len(pairs), span, mean, 0.0, 0.0, 0.0, 0.0, 1.0, False)
    fit = scipy_stats.linregress(hours, ys)
    slope, stderr = float(fit.slope), float(fit.stderr)
    half = float(scipy_stats.t.ppf(0.5 + CONFIDENCE / 2, len(pairs) - 2)) * stderr
    p_value = float(fit.pvalue)
    low, high = slope - half, slope + half
    beyond = not (low <= 0.0 <= high)
    return Drift(what, part, len(pairs), span, mean, slope, stderr, low, high, p_value, beyond)
