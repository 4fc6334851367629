"""One log line per kind of trouble per interval."""

from __future__ import annotations

import logging

import pytest

from quantload.exporter.ratelimit import RateLimitedLog


def test_repeats_are_held_back_and_counted(caplog: pytest.LogCaptureFixture) -> None:
    now = [0.0]
    log = RateLimitedLog(logging.getLogger("t"), interval_s=60, clock=lambda: now[0])
    with caplog.at_level(logging.WARNING, logger="t"):
        assert log.log(logging.WARNING, "a", "a failed")
        for _ in range(5):
            now[0] += 1
            assert not log.log(logging.WARNING, "a", "a failed")
        assert log.log(logging.WARNING, "b", "b failed")
        now[0] = 61
        assert log.log(logging.WARNING, "a", "a failed")
    messages = [r.getMessage() for r in caplog.records]
    assert messages == ["a failed", "b failed", "a failed (5 more like this in the last 61 s)"]


def test_forget_lets_the_next_line_through() -> None:
    log = RateLimitedLog(logging.getLogger("t"), interval_s=60, clock=lambda: 0.0)
    log.log(logging.WARNING, "x/metrics/timeout", "m")
    log.forget("x/")
    assert log.log(logging.WARNING, "x/metrics/timeout", "m")
