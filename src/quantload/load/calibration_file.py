"""The calibration's file: what `quantload calibrate` measured (`Calibration`), where this machine's
latest is kept, and what it holds the load client to (`machine_limits`, read before every plan).

The calibration itself (quantload.load.calibrate) runs plans through the supervisor; the supervisor
reads only this module, so neither imports the other.
"""

from __future__ import annotations

__all__ = [
    "CALIBRATION_DIR",
    "Calibration",
    "CountResult",
    "MachineLimits",
    "latest_calibration_path",
    "machine_limits",
    "trusted_streams",
    "write_calibration",
]

import dataclasses
import socket
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import BaseModel, ConfigDict

from quantload.cache_lock import cache_lock
from quantload.config import Settings
from quantload.load.processes import usable_cores
from quantload.rundir import write_json_atomic

SCHEMA = "quantload.calibration/1"
CALIBRATION_DIR = "calibration"
LATEST_JSON = "latest.json"

class CountResult(BaseModel):
    """What the client measured at one stream count; errors in seconds."""

    model_config = ConfigDict(frozen=True)

    streams: int
    workers: int
    requests: int
    ok: int
    ttft_error_p50_s: float | None
    ttft_error_p99_s: float | None
    ttft_error_vs_script_p99_s: float | None
    itl_error_p50_s: float | None
    itl_error_p99_s: float | None
    server_token_late_p99_s: float | None
    delivered_concurrency: float | None
    client_cpu_frac: float | None
    client_cpu_per_100_streams: float | None
    within_error: bool
    loop_lag_p99_s: float | None = None  # how late the load process's event loop woke up (p99)


class Calibration(BaseModel):
    """One calibration of this machine's client (the file `quantload calibrate` writes)."""

    model_config = ConfigDict(frozen=True)

    schema_version: str = SCHEMA
    created_unix_s: float
    host: str
    cores: int
    python: str
    load_average_before: float | None
    load_average_after: float | None
    fake_ttft_ms: tuple[float, float]
    fake_itl_ms: tuple[float, float]
    fake_tokens: int
    fake_closes_connections: bool
    fake_url: str | None = None  # a fake on another host; None = one on this machine's loopback
    max_error_p99_s: float
    counts: tuple[CountResult, ...]
    trusted_streams: int | None

    def verdict(self) -> str:
        """One sentence: up to how many streams this client measures within the stated error."""
        limit_ms = self.max_error_p99_s * 1000
        if self.trusted_streams is None:
            return (
                f"this machine's client measured no stream count within {limit_ms:g} ms"
                " (TTFT and ITL error p99): treat its load figures as upper bounds"
            )
        streams = "1 stream" if self.trusted_streams == 1 else f"{self.trusted_streams} concurrent streams"
        return (
            f"this machine's client measures up to {streams} within {limit_ms:g} ms"
            " (TTFT and ITL error p99)"
        )


def trusted_streams(counts: tuple[CountResult, ...]) -> int | None:
    """The largest stream count up to which every count (in rising order) was within the error."""
    trusted = None
    for count in sorted(counts, key=lambda c: c.streams):
        if not count.within_error:
            break
        trusted = count.streams
    return trusted


def proved_lag_s(calibration: Calibration) -> float | None:
    """The most event-loop lateness (p99) the client showed at a stream count it measured right;
    None when no such count reported it."""
    trusted = calibration.trusted_streams
    lags = [
        c.loop_lag_p99_s
        for c in calibration.counts
        if c.within_error and trusted is not None and c.streams <= trusted and c.loop_lag_p99_s is not None
    ]
    return max(lags, default=None)


def streams_per_process(calibration: Calibration) -> float:
    """The most streams one load process was measured right at (a count run over N workers counts
    its streams / N); 0 when no count was."""
    trusted = calibration.trusted_streams
    if trusted is None:
        return 0.0
    proved = [
        c.streams / max(c.workers, 1) for c in calibration.counts if c.within_error and c.streams <= trusted
    ]
    return max(proved, default=0.0)


@dataclass(frozen=True)
class MachineLimits:
    """What this machine's load client is held to, and where that came from: the error its figures
    are stated within, the event-loop lateness beyond which they may not be (the stated error, or
    more where the calibration measured right with more), the streams one process measured right."""

    error_s: float
    lag_s: float
    streams_per_process: float | None  # None: never calibrated here
    source: str


def latest_calibration_path(settings: Settings, cwd: Path) -> Path:
    """Where `quantload calibrate` keeps this machine's latest result by default."""
    return cwd / settings.run.out / CALIBRATION_DIR / LATEST_JSON


def machine_limits(settings: Settings, cwd: Path) -> MachineLimits:
    """The latest calibration of this machine (same host, same cores), else the configured error
    bound alone (`calibrate.max_error_p99_s`)."""
    path = latest_calibration_path(settings, cwd)
    error = settings.calibrate.max_error_p99_s
    configured = MachineLimits(error, error, None, "no calibration of this machine")
    try:
        calibration = Calibration.model_validate_json(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return configured
    if calibration.host != socket.gethostname() or calibration.cores != usable_cores():
        return dataclasses.replace(configured, source=f"{path.name} is of another machine")
    stamp = datetime.fromtimestamp(calibration.created_unix_s, UTC).strftime("%Y-%m-%d %H:%M UTC")
    stated = calibration.max_error_p99_s
    lag = max(stated, proved_lag_s(calibration) or 0.0)
    return MachineLimits(stated, lag, streams_per_process(calibration), f"calibration of {stamp}")


def write_calibration(result: Calibration, out_dir: Path) -> Path:
    """Write `calibration-<UTC time>.json` and, unless a newer one is there, `latest.json`: under
    the folder's lock, each whole (two calibrations at once never leave half a file); return the
    first."""
    stamp = datetime.fromtimestamp(result.created_unix_s, UTC).strftime("%Y%m%dT%H%M%SZ")
    path = out_dir / f"calibration-{stamp}.json"
    data = result.model_dump(mode="json")
    with cache_lock(out_dir, "the calibration"):
        write_json_atomic(path, data)
        latest = out_dir / LATEST_JSON
        try:
            newest = Calibration.model_validate_json(latest.read_text(encoding="utf-8")).created_unix_s
        except (OSError, ValueError):
            newest = None
        if newest is None or newest <= result.created_unix_s:
            write_json_atomic(latest, data)
    return path
