"""Decided comparisons: "A beats B by x [low, high]" or "no difference shown", never a ranking of noise.

Two kinds of evidence, each compared in one place:

- **Limits** (the tuner, the quantization choice): a limit search or a sweep says of each side the
  highest level shown to meet the SLO and the lowest shown to miss it, each at the SLO's
  confidence; the true limit lies between. A beats B when A was shown to meet the SLO at a level
  B was shown to miss: both verdicts are claims at that confidence, so the comparison holds unless
  one of them is wrong (at most twice the verdicts' error). The ratio of the limits is bounded by
  the two ranges: at least A's lowest over B's highest possible limit.
- **Per-request figures** (speculation's decode speed, KV-cache types, two runs' latencies): the
  ratio of the two sides' medians with a bootstrap confidence interval (scipy.stats.bootstrap,
  BCa); a difference is shown when the interval lies wholly beyond 1 by more than `margin`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Side = Literal["a", "b"]
BOOTSTRAP_RESAMPLES = 2000
MIN_SAMPLE = 5  # fewer per side: nothing is shown


@dataclass(frozen=True)
class LimitRange:
    """Where a limit lies: at least `met` (the highest level shown to meet the SLO, every lower one
    meeting; None: none), below `missed` (the lowest level shown to miss it; None: none was)."""

    met: float | None
    missed: float | None
    whole: bool = True  # levels are whole users (the limit is at most `missed` - 1)

    def highest(self) -> float | None:
        """The highest the limit can be (None: unbounded above)."""
        if self.missed is None:
            return None
        return self.missed - 1 if self.whole else self.missed


@dataclass(frozen=True)
class Comparison:
    """What the data show of A against B."""

    better: Side | None  # None: no difference shown
    ratio: float | None  # A's figure over B's (the point estimate)
    low: float | None  # the ratio's interval (None: unbounded below / unknown)
    high: float | None  # (None: unbounded above / unknown)
    confidence: float
    basis: str  # what the comparison rests on, in words

    @property
    def shown(self) -> bool:
        return self.better is not None

    def text(self, a: str, b: str) -> str:
        """'A beats B by x1.50 [1.20, 2.00]' or 'no difference shown between A and B (...)'."""
        interval = _interval(self.low, self.high)
        if self.better is None:
            around = f": x{self.ratio:.2f} {interval}" if self.ratio is not None else ""
            return f"no difference shown between {a} and {b}{around} ({self.basis})"
        winner, loser = (a, b) if self.better == "a" else (b, a)
        ratio = self.ratio if self.better == "a" else (1 / self.ratio if self.ratio else None)
        low, high = (self.low, self.high) if self.better == "a" else _inverted(self.low, self.high)
        by = f" by x{ratio:.2f} {_interval(low, high)}" if ratio is not None else f" {_interval(low, high)}"
        return f"{winner} beats {loser}{by} ({self.basis})"


def _interval(low: float | None, high: float | None) -> str:
    left = f"{low:.2f}" if low is not None else "…"
    right = f"{high:.2f}" if high is not None and math.isfinite(high) else "…"
    return f"[{left}, {right}]"


def _inverted(low: float | None, high: float | None) -> tuple[float | None, float | None]:
    return (1 / high if high else None), (1 / low if low else None)


def _ratio(top: float | None, bottom: float | None) -> float | None:
    if top is None or bottom is None or bottom <= 0:
        return None
    return top / bottom


def compare_normal(
    a: float, a_error: float, b: float, b_error: float, confidence: float = 0.95
) -> Comparison:
    """A against B where each comes with its standard error (perplexity, KL divergence): a
    difference is shown when it exceeds the two-sided normal quantile times their combined error;
    better is the larger (callers of a cost read it the other way round)."""
    from scipy.stats import norm

    spread = math.hypot(a_error, b_error)
    z = float(norm.ppf(0.5 + confidence / 2))
    ratio = a / b if b else None
    low = (a - z * spread) / b if b else None
    high = (a + z * spread) / b if b else None
    better: Side | None = None
    if a - b > z * spread:
        better = "a"
    elif b - a > z * spread:
        better = "b"
    return Comparison(better, ratio, low, high, confidence, f"each ± its standard error, {confidence:.0%}")


def compare_limits(a: LimitRange, b: LimitRange, confidence: float) -> Comparison:
    """A against B by their limits (see the module docstring)."""
    basis = f"limits decided at {confidence:.0%} confidence each"
    low = _ratio(a.met, b.highest())
    high = _ratio(a.highest(), b.met)
    ratio = _ratio(a.met, b.met)
    better: Side | None = None
    if a.met is not None and b.missed is not None and a.met >= b.missed:
        better = "a"
    elif b.met is not None and a.missed is not None and b.met >= a.missed:
        better = "b"
    return Comparison(better, ratio, low, high, confidence, basis)


def compare_medians(
    a: Sequence[float],
    b: Sequence[float],
    confidence: float = 0.95,
    margin: float = 0.0,
    seed: int = 0,
) -> Comparison:
    """A's median over B's, with a bootstrap interval; better is the side whose median is larger
    (callers comparing a cost, lower better, pass the two the other way round or read the ratio)."""
    return compare_percentiles(a, b, 50.0, confidence, margin, seed)


def compare_percentiles(
    a: Sequence[float],
    b: Sequence[float],
    q: float,
    confidence: float = 0.95,
    margin: float = 0.0,
    seed: int = 0,
) -> Comparison:
    """A's q-th percentile over B's, with a bootstrap interval (see `compare_medians`)."""
    clean_a = [float(x) for x in a if x is not None and math.isfinite(x)]
    clean_b = [float(x) for x in b if x is not None and math.isfinite(x)]
    what = "medians" if q == 50 else f"p{q:g}s"
    basis = f"{what} of {len(clean_a)} and {len(clean_b)} requests, bootstrap {confidence:.0%}"
    if len(clean_a) < MIN_SAMPLE or len(clean_b) < MIN_SAMPLE:
        return Comparison(None, None, None, None, confidence, f"too few requests ({basis})")
    import numpy as np
    from scipy.stats import bootstrap

    below_b = float(np.percentile(clean_b, q))
    ratio = float(np.percentile(clean_a, q)) / below_b if below_b > 0 else None
    if ratio is None:
        return Comparison(None, None, None, None, confidence, basis)

    def statistic(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
        below = np.percentile(y, q, axis=axis)
        ratio: np.ndarray = np.percentile(x, q, axis=axis) / np.where(below > 0, below, np.nan)
        return ratio

    if min(clean_a) == max(clean_a) and min(clean_b) == max(clean_b):  # no spread: the ratio is exact
        better_exact: Side | None = None if ratio == 1 else ("a" if ratio > 1 + margin else None)
        if ratio < 1 / (1 + margin):
            better_exact = "b"
        return Comparison(better_exact, ratio, ratio, ratio, confidence, f"{basis}; every request alike")
    found = bootstrap(
        (np.asarray(clean_a), np.asarray(clean_b)), statistic, n_resamples=BOOTSTRAP_RESAMPLES,
        confidence_level=confidence, method="percentile", vectorized=True, random_state=seed,
    )  # fmt: skip
    low, high = float(found.confidence_interval.low), float(found.confidence_interval.high)
    if not (math.isfinite(low) and math.isfinite(high)):
        return Comparison(None, ratio, None, None, confidence, f"{basis}; no interval")
    better: Side | None = None
    if math.isfinite(low) and low > 1 + margin:
        better = "a"
    elif math.isfinite(high) and high < 1 / (1 + margin):
        better = "b"
    return Comparison(better, ratio, low, high, confidence, basis)
