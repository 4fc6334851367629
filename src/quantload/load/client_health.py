"""How busy the load processes were during a stage, and whether they may have been the bottleneck.

Each Locust process that sends requests reports windows of CPU time and event-loop lateness
(`quantload.load.in_locust.health`); a master, which sends none, reports its CPU time only. Both
report their resident memory. The stage_end line carries the verdict and the memory the load
processes held at the stage's end. Plain Python: no Locust, no gevent, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from quantload.stats import percentile


@dataclass
class ClientHealth:
    """CPU time and event-loop lateness of the load processes over one stage."""

    cpu_s: dict[str, float] = field(default_factory=dict)
    wall_s: dict[str, float] = field(default_factory=dict)
    lag_samples_s: list[float] = field(default_factory=list)
    coordinator_cpu_s: dict[str, float] = field(default_factory=dict)
    coordinator_wall_s: dict[str, float] = field(default_factory=dict)
    rss_bytes: dict[str, int] = field(default_factory=dict)  # each process's latest

    def add(
        self,
        process: str,
        cpu_s: float,
        wall_s: float,
        lag_samples_s: Iterable[float],
        rss_bytes: int | None = None,
    ) -> None:
        """One window of measurements from one process that sends requests."""
        self.cpu_s[process] = self.cpu_s.get(process, 0.0) + cpu_s
        self.wall_s[process] = self.wall_s.get(process, 0.0) + wall_s
        self.lag_samples_s.extend(lag_samples_s)
        self._resident(process, rss_bytes)

    def add_coordinator(
        self, process: str, cpu_s: float, wall_s: float, rss_bytes: int | None = None
    ) -> None:
        """One window of a process that sends nothing (the master): counted in the total only."""
        self.coordinator_cpu_s[process] = self.coordinator_cpu_s.get(process, 0.0) + cpu_s
        self.coordinator_wall_s[process] = self.coordinator_wall_s.get(process, 0.0) + wall_s
        self._resident(process, rss_bytes)

    def _resident(self, process: str, rss_bytes: int | None) -> None:
        if rss_bytes is not None:
            self.rss_bytes[process] = rss_bytes

    def resident_bytes(self) -> int | None:
        """Every load process's resident memory as it last reported it, added up (None: unknown)."""
        return sum(self.rss_bytes.values()) if self.rss_bytes else None

    def cpu_frac(self) -> float | None:
        """The busiest sending process's CPU time over wall time (1.0 = one core)."""
        fracs = [self.cpu_s[p] / self.wall_s[p] for p in self.cpu_s if self.wall_s.get(p, 0) > 0]
        return max(fracs) if fracs else None

    def cpu_total_frac(self) -> float | None:
        """Every load process's CPU time over wall time, added up (2.0 = two cores' worth)."""
        total = 0.0
        seen = False
        for cpu, wall in ((self.cpu_s, self.wall_s), (self.coordinator_cpu_s, self.coordinator_wall_s)):
            for process, seconds in cpu.items():
                if wall.get(process, 0) > 0:
                    total += seconds / wall[process]
                    seen = True
        return total if seen else None

    def lag_p99_s(self) -> float | None:
        return percentile(self.lag_samples_s, 99)

    def lag_max_s(self) -> float | None:
        return max(self.lag_samples_s) if self.lag_samples_s else None

    def saturated(self, cpu_frac_limit: float, lag_limit_s: float) -> bool | None:
        """True when the client may have been the bottleneck; None without measurements."""
        cpu, lag = self.cpu_frac(), self.lag_p99_s()
        if cpu is None and lag is None:
            return None
        return (cpu is not None and cpu >= cpu_frac_limit) or (lag is not None and lag >= lag_limit_s)
