"""Number formatting shared by the renderers and the verdict sentences; None shows as a dash."""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import pandas as pd

DASH = "–"


def cell_float(value: Any) -> float | None:
    """A table cell as a float; None for missing, NaN, booleans and non-numbers."""
    if value is None or isinstance(value, bool):
        return None
    try:
        return None if pd.isna(value) else float(value)
    except (TypeError, ValueError):
        return None


def _missing(value: float | None) -> bool:
    return value is None or not math.isfinite(value)


def duration(value_s: float | None) -> str:
    """'850 ms', '12.3 ms', '1.34 s'."""
    if value_s is None or _missing(value_s):
        return DASH
    if abs(value_s) >= 1.0:
        return f"{value_s:.2f} s"
    ms = value_s * 1000.0
    return f"{ms:.1f} ms" if abs(ms) < 100 else f"{ms:.0f} ms"


def number(value: float | None, digits: int = 1) -> str:
    """A plain number with thousands separators."""
    if value is None or _missing(value):
        return DASH
    return f"{value:,.{digits}f}"


def percent(fraction: float | None, digits: int = 1, signed: bool = False) -> str:
    """0.123 -> '12.3 %' (signed: '+12.3 %')."""
    if fraction is None or _missing(fraction):
        return DASH
    return f"{fraction * 100:+.{digits}f} %" if signed else f"{fraction * 100:.{digits}f} %"


def mib(size_bytes: float | None) -> str:
    """Bytes as MiB with two decimals."""
    if size_bytes is None or _missing(size_bytes):
        return DASH
    return f"{size_bytes / 2**20:,.2f} MiB"


def with_range(median: float | None, low: float | None, high: float | None, show: str = "duration") -> str:
    """'120 ms (110–130 ms)': a median of repeats and its min-max range (one unit when shared)."""
    render = duration if show == "duration" else number
    if median is None or _missing(median):
        return DASH
    if low is None or high is None or _missing(low) or _missing(high) or low == high:
        return render(median)
    left, right = render(low), render(high)
    left_unit, right_unit = left.rpartition(" ")[2], right.rpartition(" ")[2]
    if show == "duration" and left_unit == right_unit:
        left = left.rpartition(" ")[0]
    return f"{render(median)} ({left}{DASH}{right})"


def utc(unix_s: float | None) -> str:
    """Unix seconds as 'YYYY-MM-DD HH:MM:SS UTC'."""
    if unix_s is None or _missing(unix_s):
        return DASH
    return datetime.fromtimestamp(unix_s, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
