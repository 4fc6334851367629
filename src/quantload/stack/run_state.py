"""`run.json`'s writer: the run's account of itself, rewritten atomically after every change.

The file's shape is `quantload.rundir.run_file.RunFile`, the same model the report reads.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from quantload.rundir import write_json_atomic
from quantload.rundir.handle import RunDir
from quantload.rundir.run_file import (
    PrometheusRecord,
    RunFile,
    RunStatus,
    ServerRecord,
    StepRecord,
    StepStatus,
)


class RunState:
    """The run's own account of itself, kept in `run.json` inside the run directory."""

    def __init__(
        self,
        run_dir: Path,
        run_id: str,
        profile: str,
        model: str,
        servers_at_once: bool,
        written: bool = True,
    ) -> None:
        """`written`: kept in the folder's run.json; else in memory only (a command whose folder
        may hold another run's run.json)."""
        self.path = RunDir(run_dir).run_file_path if written else None
        self._file = RunFile(
            run_id=run_id,
            started_unix_s=time.time(),
            status="running",
            profile=profile,
            model=model,
            servers_at_once=servers_at_once,
            prometheus=PrometheusRecord(available=False, why="not started yet"),
        )
        self._started_monotonic: dict[int, float] = {}
        self.save()

    @property
    def status(self) -> RunStatus:
        """ "running" until `finish`."""
        return self._file.status or "running"

    @property
    def data(self) -> dict[str, Any]:
        """run.json as last written (a copy)."""
        return self._file.to_json()

    def save(self) -> None:
        if self.path is not None:
            write_json_atomic(self.path, self._file.to_json())

    def begin(self, name: str, quant: str | None = None) -> int:
        """Record a step as running; returns its index for `end`."""
        self._file.steps.append(StepRecord(name=name, quant=quant, started_unix_s=time.time()))
        index = len(self._file.steps) - 1
        self._started_monotonic[index] = time.monotonic()
        self.save()
        return index

    def end(
        self, index: int, status: StepStatus, error: str | None = None, busy_seconds: float | None = None
    ) -> None:
        """Close a step with its outcome."""
        step = self._file.steps[index]
        step.status = status
        step.error = error
        step.finished_unix_s = time.time()
        step.seconds = round(time.monotonic() - self._started_monotonic[index], 3)
        step.busy_seconds = round(busy_seconds, 3) if busy_seconds is not None else None
        self.save()

    def skip(self, name: str, quant: str | None, why: str) -> None:
        """Record a step that did not run, and why."""
        index = self.begin(name, quant)
        self.end(index, "skipped", why)

    def fail_unrun(self, name: str, quant: str | None, why: str) -> None:
        """Record a step that could not run because something it needs failed earlier."""
        index = self.begin(name, quant)
        self.end(index, "failed", why)

    def server(self, quant: str, **fields: Any) -> None:
        """Update what is known about one quantization's server (fields of `ServerRecord`)."""
        unknown = set(fields) - set(ServerRecord.model_fields)
        if unknown:
            raise TypeError(f"ServerRecord has no field(s) {', '.join(sorted(unknown))}")
        current = self._file.servers.get(quant, ServerRecord())
        given = ServerRecord.model_validate(fields).model_dump(exclude_unset=True)
        self._file.servers[quant] = current.model_copy(update=given)
        self.save()

    def prometheus(self, available: bool, url: str | None, why: str | None, data_dir: str | None) -> None:
        """Record whether the run has a Prometheus, where, and where its data is kept."""
        self._file.prometheus = PrometheusRecord(available=available, url=url, why=why, data_dir=data_dir)
        self.save()

    def note(self, text: str) -> None:
        """Add a line to the run's notes (shown in the report)."""
        self._file.notes.append(text)
        self.save()

    def finish(self, status: RunStatus) -> None:
        """Mark the run ended; steps still running are closed as failed."""
        for index, step in enumerate(self._file.steps):
            if step.status == "running":
                self.end(index, "failed", f"run ended ({status}) before the step did")
        self._file.status = status
        self._file.finished_unix_s = time.time()
        self.save()

    def steps(self) -> list[StepRecord]:
        """Every step so far, in the order they began."""
        return list(self._file.steps)
