"""Durations, numbers and shares as the report and every verdict sentence write them (no pandas,
so the load side can use them too); a missing value shows as a dash."""

from __future__ import annotations

import math

DASH = "–"


def is_missing(value: float | None) -> bool:
    return value is None or not math.isfinite(value)


def duration(value_s: float | None) -> str:
    """'850 ms', '12.3 ms', '1.34 s'."""
    if value_s is None or is_missing(value_s):
        return DASH
    if abs(value_s) >= 1.0:
        return f"{value_s:.2f} s"
    ms = value_s * 1000.0
    return f"{ms:.1f} ms" if abs(ms) < 100 else f"{ms:.0f} ms"


def span(value_s: float | None) -> str:
    """A length of time a person plans by: '40 s', '3.5 min', '2.1 h' (never '0 min')."""
    if value_s is None or is_missing(value_s):
        return DASH
    if abs(value_s) < 90:
        return f"{value_s:.0f} s"
    if abs(value_s) < 90 * 60:
        return f"{value_s / 60:.1f} min"
    return f"{value_s / 3600:.1f} h"


def number(value: float | None, digits: int = 1) -> str:
    """A plain number with thousands separators."""
    if value is None or is_missing(value):
        return DASH
    return f"{value:,.{digits}f}"


def percent(fraction: float | None, digits: int = 1, signed: bool = False) -> str:
    """0.123 -> '12.3 %' (signed: '+12.3 %')."""
    if fraction is None or is_missing(fraction):
        return DASH
    return f"{fraction * 100:+.{digits}f} %" if signed else f"{fraction * 100:.{digits}f} %"


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """'1 stage', '3 stages' ('1 thing(s)' never)."""
    return f"{count:,} {noun if count == 1 else (plural or noun + 's')}"
