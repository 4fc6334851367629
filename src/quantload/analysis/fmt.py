"""Number formatting shared by the renderers and the verdict sentences; None shows as a dash."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pandas as pd

from quantload.text_format import DASH, counted, duration, is_missing, number, percent

__all__ = [
    "DASH", "cell_float", "counted", "duration", "mib", "number", "percent", "utc", "with_interval",
    "with_range",
]  # fmt: skip


def cell_float(value: Any) -> float | None:
    """A table cell as a float; None for missing, NaN, booleans and non-numbers."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return None if pd.isna(value) else float(value)
    except (TypeError, ValueError):
        return None


def mib(size_bytes: float | None) -> str:
    """Bytes as MiB with two decimals."""
    if size_bytes is None or is_missing(size_bytes):
        return DASH
    return f"{size_bytes / 2**20:,.2f} MiB"


def with_range(median: float | None, low: float | None, high: float | None, show: str = "duration") -> str:
    """'120 ms (110–130 ms)': a median of repeats and its min-max range (one unit when shared)."""
    render = duration if show == "duration" else number
    if median is None or is_missing(median):
        return DASH
    if low is None or high is None or is_missing(low) or is_missing(high) or low == high:
        return render(median)
    left, right = render(low), render(high)
    left_unit, right_unit = left.rpartition(" ")[2], right.rpartition(" ")[2]
    if show == "duration" and left_unit == right_unit:
        left = left.rpartition(" ")[0]
    return f"{render(median)} ({left}{DASH}{right})"


def with_interval(value: float | None, interval: Any, show: str = "duration") -> str:
    """'325 ms [301–410]': a percentile and its confidence interval (one unit when shared); a side
    the requests cannot bound shows as '…' ('325 ms [301 ms–…]' for a p99 of few requests)."""
    render = duration if show == "duration" else number
    if value is None or is_missing(value):
        return DASH
    if not isinstance(interval, (tuple, list)) or len(interval) != 2:
        return render(value)
    low, high = interval
    if low is None and high is None:
        return f"{render(value)} [unbounded]"
    left = render(low) if low is not None and not is_missing(low) else "…"
    right = render(high) if high is not None and not is_missing(high) else "…"
    left_unit, right_unit = left.rpartition(" ")[2], right.rpartition(" ")[2]
    if show == "duration" and left_unit == right_unit and " " in left:
        left = left.rpartition(" ")[0]
    return f"{render(value)} [{left}{DASH}{right}]"


def utc(unix_s: float | None) -> str:
    """Unix seconds as 'YYYY-MM-DD HH:MM:SS UTC'."""
    if unix_s is None or is_missing(unix_s):
        return DASH
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
