"""`run.json`: what a run has done so far, rewritten atomically after every change.

Schema `quantload.run/1`:
  run_id, started_unix_s, finished_unix_s (null until the run ends), status
  ("running" | "finished" | "failed" | "interrupted"), profile, model, servers_at_once,
  steps: [{name, quant, status ("running" | "ok" | "failed" | "skipped"), started_unix_s,
           finished_unix_s, seconds, busy_seconds, error}],
  servers: {quant: {url, log, pid, status ("running" | "ok" | "died" | "failed_to_start")}},
  prometheus: {available, url, why, data_dir},
  notes: [text]
`busy_seconds` is the part of a step spent measuring (for load steps: the stages themselves),
which is how the run's own overhead is computed.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

from quantload.rundir import RUN_JSON, write_json_atomic

RUN_SCHEMA = "quantload.run/1"
StepStatus = Literal["running", "ok", "failed", "skipped"]
RunStatus = Literal["running", "finished", "failed", "interrupted"]


@dataclass
class StepRecord:
    """One step of the protocol."""

    name: str
    quant: str | None
    status: StepStatus = "running"
    started_unix_s: float = field(default_factory=time.time)
    finished_unix_s: float | None = None
    seconds: float | None = None
    busy_seconds: float | None = None
    error: str | None = None


class RunState:
    """The run's own account of itself, kept in `run.json` inside the run directory."""

    def __init__(self, run_dir: Path, run_id: str, profile: str, model: str, servers_at_once: bool) -> None:
        self.path = run_dir / RUN_JSON
        self.data: dict[str, Any] = {
            "schema": RUN_SCHEMA,
            "run_id": run_id,
            "started_unix_s": time.time(),
            "finished_unix_s": None,
            "status": "running",
            "profile": profile,
            "model": model,
            "servers_at_once": servers_at_once,
            "steps": [],
            "servers": {},
            "prometheus": {"available": False, "url": None, "why": "not started yet", "data_dir": None},
            "notes": [],
        }
        self._steps: list[StepRecord] = []
        self._started_monotonic: dict[int, float] = {}
        self.save()

    @property
    def status(self) -> RunStatus:
        """The run's status so far."""
        status: RunStatus = self.data["status"]
        return status

    def save(self) -> None:
        self.data["steps"] = [asdict(step) for step in self._steps]
        write_json_atomic(self.path, self.data)

    def begin(self, name: str, quant: str | None = None) -> int:
        """Record a step as running; returns its index for `end`."""
        self._steps.append(StepRecord(name, quant))
        index = len(self._steps) - 1
        self._started_monotonic[index] = time.monotonic()
        self.save()
        return index

    def end(
        self, index: int, status: StepStatus, error: str | None = None, busy_seconds: float | None = None
    ) -> None:
        """Close a step with its outcome."""
        step = self._steps[index]
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
        """Update what is known about one quantization's server."""
        self.data["servers"].setdefault(quant, {}).update(fields)
        self.save()

    def prometheus(self, available: bool, url: str | None, why: str | None, data_dir: str | None) -> None:
        self.data["prometheus"] = {"available": available, "url": url, "why": why, "data_dir": data_dir}
        self.save()

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        self.save()

    def finish(self, status: RunStatus) -> None:
        for index, step in enumerate(self._steps):
            if step.status == "running":
                self.end(index, "failed", f"run ended ({status}) before the step did")
        self.data["status"] = status
        self.data["finished_unix_s"] = time.time()
        self.save()

    def steps(self) -> list[StepRecord]:
        return list(self._steps)
