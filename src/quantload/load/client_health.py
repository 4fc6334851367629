"""How busy the load processes were during a stage, and whether they may have been the bottleneck.

Each Locust process that sends requests reports windows of CPU time and event-loop lateness
(`quantload.load.in_locust.health`); a master, which sends none, reports its CPU time only. Both
report their resident memory. The stage_end line carries the verdict and the memory the load
processes held at the stage's end. Plain Python: no Locust, no gevent, no clock.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from quantload.stats import percentile

if TYPE_CHECKING:
    from quantload.load.plan import LoadPlan

TrustLevel = Literal["ok", "degraded", "saturated"]


@dataclass(frozen=True)
class TrustBounds:
    """What a stage's load client is held to: the error its figures are stated within (the
    calibration's `max_error_p99_s`), the event-loop lateness (p99) beyond which they may not be
    (that error, or more where this machine's calibration measured right with more), the streams
    one load process was measured right at here (`quantload calibrate`; None: never calibrated
    here) and the saturation limits."""

    error_s: float
    lag_s: float
    streams_per_process: float | None
    saturation_cpu_frac: float
    saturation_lag_s: float


@dataclass(frozen=True)
class ClientTrust:
    """How far a stage's figures can be trusted, and why not further: "ok" (within what the client
    is stated to measure right), "degraded" (the figures may be worse than stated: its event loop
    woke later than the stated error, or it held more streams per process than this machine's
    calibration proved) or "saturated" (the client itself may have been the bottleneck)."""

    level: TrustLevel
    why: str | None = None


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

    def trust(self, bounds: TrustBounds, streams_per_process: float) -> ClientTrust | None:
        """How far the stage's figures can be trusted (ClientTrust); None when nothing was measured
        and nothing exceeded the calibration (a stage shorter than one health window).

        Between what `quantload calibrate` proves and saturation the figures can be worse than
        stated without the client being the bottleneck: an event loop that wakes up late reads
        every answer late, and beyond the calibrated streams nothing was proved.
        """
        cpu, lag = self.cpu_frac(), self.lag_p99_s()
        if self.saturated(bounds.saturation_cpu_frac, bounds.saturation_lag_s):
            return ClientTrust(
                "saturated",
                f"the busiest load process used {_share(cpu)} of a core and its event loop woke up"
                f" {_ms(lag)} late (p99): the client itself may have been the bottleneck",
            )
        reasons = []
        if lag is not None and lag > bounds.lag_s:
            proven = "" if bounds.lag_s <= bounds.error_s else f" (and the {_ms(bounds.lag_s)} calibrated)"
            reasons.append(
                f"its event loop woke up {_ms(lag)} late (p99), more than the {_ms(bounds.error_s)}"
                f" its figures are stated within{proven}"
            )
        proved = bounds.streams_per_process
        if proved is not None and streams_per_process > proved:
            reasons.append(
                f"{streams_per_process:g} streams per load process, more than the {proved:g} this"
                " machine's calibration measured right"
            )
        if reasons:
            return ClientTrust("degraded", "; ".join(reasons))
        return ClientTrust("ok") if cpu is not None or lag is not None else None


def _ms(seconds: float | None) -> str:
    return "?" if seconds is None else f"{seconds * 1000:.1f} ms"


def _share(fraction: float | None) -> str:
    return "?" if fraction is None else f"{fraction * 100:.0f} %"


def trust_bounds(plan: LoadPlan) -> TrustBounds:
    """The bounds a plan holds its client to."""
    return TrustBounds(
        error_s=plan.trust_error_s,
        lag_s=plan.trust_lag_s,
        streams_per_process=plan.calibrated_streams_per_process,
        saturation_cpu_frac=plan.saturation_cpu_frac,
        saturation_lag_s=plan.saturation_lag_s,
    )
