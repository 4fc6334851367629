"""Display formatting: units in the text, a dash for what is missing."""

from __future__ import annotations

from quantload.analysis import fmt


def test_durations_and_ranges() -> None:
    assert fmt.duration(0.0123) == "12.3 ms"
    assert fmt.duration(0.85) == "850 ms"
    assert fmt.duration(1.234) == "1.23 s"
    assert fmt.duration(None) == fmt.DASH
    assert fmt.with_range(0.12, 0.11, 0.13) == "120 ms (110–130 ms)"
    assert fmt.with_range(0.5, 0.05, 1.5) == "500 ms (50.0 ms–1.50 s)"
    assert fmt.with_range(0.12, 0.12, 0.12) == "120 ms"
    assert fmt.with_range(None, 1, 2) == fmt.DASH
    assert fmt.with_range(41.5, 40.0, 43.25, "number") == "41.5 (40.0–43.2)"


def test_numbers_sizes_percent() -> None:
    assert fmt.number(1234.56) == "1,234.6"
    assert fmt.mib(2 * 2**20) == "2.00 MiB"
    assert fmt.percent(0.1234) == "12.3 %"
    assert fmt.percent(-0.05, 0, signed=True) == "-5 %"
    assert fmt.number(float("nan")) == fmt.DASH
    assert fmt.utc(0) == "1970-01-01 00:00:00 UTC"
