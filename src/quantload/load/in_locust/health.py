"""How busy a Locust process is: event-loop lateness and CPU time, a window at a time, and how
much memory it holds resident at the end of each window.

After each stage's users are spawned every process runs `freeze_heap` (`gc.collect();
gc.freeze()`), so no full collection of Locust's import-time objects lands on a measured request;
the monitor then drops its current window, whose pause was ours and deliberate.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable

import gevent

from quantload.load.in_locust.messages import HealthWindow
from quantload.load.in_locust.runtime import process_name
from quantload.load.process_memory import resident_bytes

LAG_PERIOD_S = 0.01
HEALTH_WINDOW_S = 0.25

HealthReport = Callable[[HealthWindow], None]


class HealthMonitor:
    """Measures how late a 10 ms sleep wakes up, CPU time and resident memory; reports every
    quarter second."""

    def __init__(self, report: HealthReport, on_tick: Callable[[], None] | None = None) -> None:
        self.report = report
        self.on_tick = on_tick
        self.name = process_name()
        self._restart = False

    def restart(self) -> None:
        """Drop the current window (called right after a deliberate pause)."""
        self._restart = True

    def run(self) -> None:
        """Forever (a greenlet)."""
        window_start, cpu_start = time.perf_counter(), time.process_time()
        lags: list[float] = []
        while True:
            before = time.perf_counter()
            gevent.sleep(LAG_PERIOD_S)
            now = time.perf_counter()
            if self._restart:
                self._restart = False
                window_start, cpu_start, lags = now, time.process_time(), []
                continue
            lags.append(max(now - before - LAG_PERIOD_S, 0.0))
            if now - window_start >= HEALTH_WINDOW_S:
                cpu = time.process_time()
                window = HealthWindow(
                    self.name, cpu - cpu_start, now - window_start, tuple(lags), resident_bytes()
                )
                self.report(window)
                window_start, cpu_start, lags = now, cpu, []
                if self.on_tick is not None:
                    self.on_tick()


def freeze_heap(monitor: HealthMonitor | None = None) -> None:
    """Collect once and move every surviving object out of the collector's way."""
    gc.collect()
    gc.freeze()
    if monitor is not None:
        monitor.restart()
