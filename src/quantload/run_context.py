"""What every load experiment is handed: the run it belongs to, instead of loose arguments.

    context = RunContext(RunDir(out), run_id, settings, cwd=cwd, environ=environ)
    context.with_progress(progress).with_loadgen_port(port)

It holds the run directory (a typed handle: quantload.rundir.handle.RunDir), the run id, the
resolved settings, where progress and warnings go, the port the load processes serve /metrics on
(the run picks it before Prometheus starts, so Prometheus can scrape it), the working folder
relative paths are read from, and the environment the load processes start with. It is frozen:
a step that needs another progress callback makes a copy (`with_progress`), nothing is changed in
place.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from quantload.config import Settings
from quantload.progress import ProgressCallback, no_progress
from quantload.rundir.handle import RunDir
from quantload.slo import Slo

Warn = Callable[[str], None]
_log = logging.getLogger(__name__)


def log_warning(line: str) -> None:
    """The default `warn`: the line goes to the log."""
    _log.warning("%s", line)


@dataclass(frozen=True)
class RunContext:
    """One run as its load experiments see it (see the module docstring)."""

    run_dir: RunDir
    run_id: str
    settings: Settings
    progress: ProgressCallback = no_progress
    warn: Warn = log_warning
    loadgen_port: int | None = None  # None: load.metrics_port
    cwd: Path = field(default_factory=Path.cwd)
    environ: Mapping[str, str] = field(default_factory=dict)

    @property
    def slo(self) -> Slo:
        """The SLO every stage of the run is judged against."""
        return Slo.of(self.settings.slo)

    @property
    def metrics_port(self) -> int:
        """The /metrics port of the load process that drives the stages (its workers take +1, ...)."""
        return self.loadgen_port if self.loadgen_port is not None else self.settings.load.metrics_port

    def with_progress(self, progress: ProgressCallback) -> RunContext:
        return dataclasses.replace(self, progress=progress)

    def with_settings(self, settings: Settings) -> RunContext:
        return dataclasses.replace(self, settings=settings)
