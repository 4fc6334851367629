"""`run.json` (schema `quantload.run/1`): what a run has done so far, as one typed model.

The run writes it (quantload.stack.run_state.RunState rewrites it atomically after every change)
and the report reads it; both go through `RunFile`. `busy_seconds` of a step is the part spent
measuring (for load steps: the stages themselves), which is how the run's own overhead is computed.

Every field may be missing from a run.json of an interrupted run, or one edited by hand: a reader
takes a missing field as "not recorded". Keys it does not know are ignored (later additions).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from quantload.rundir import read_json

RUN_SCHEMA = "quantload.run/1"
StepStatus = Literal["running", "ok", "failed", "skipped"]
RunStatus = Literal["running", "finished", "failed", "interrupted"]
ServerStatus = Literal["running", "ok", "died", "failed_to_start"]


class _RunPart(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class StepRecord(_RunPart):
    """One step of the protocol (prepare, quality per quant, load per quant, report, ...)."""

    name: str
    quant: str | None = None
    status: StepStatus = "running"
    started_unix_s: float | None = None
    finished_unix_s: float | None = None
    seconds: float | None = None
    busy_seconds: float | None = None
    error: str | None = None


class ServerRecord(_RunPart):
    """What is known about one quantization's llama-server."""

    url: str | None = None
    log: str | None = None
    pid: int | None = None
    status: ServerStatus | None = None
    exit_code: int | None = None


class PrometheusRecord(_RunPart):
    """Whether the run had a Prometheus, where, and where it kept its data."""

    available: bool | None = None
    url: str | None = None
    why: str | None = None
    data_dir: str | None = None


class RunFile(_RunPart):
    """The whole run.json."""

    schema_: str = Field(default=RUN_SCHEMA, alias="schema")
    run_id: str | None = None
    started_unix_s: float | None = None
    finished_unix_s: float | None = None
    status: RunStatus | None = None
    profile: str | None = None
    model: str | None = None
    servers_at_once: bool | None = None
    steps: list[StepRecord] = Field(default_factory=list)
    servers: dict[str, ServerRecord] = Field(default_factory=dict)
    prometheus: PrometheusRecord | None = None
    notes: list[str] = Field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        """The JSON object as written to disk."""
        return self.model_dump(mode="json", by_alias=True)


def load_run_file(path: Path) -> RunFile:
    """Read a run.json; ValueError (pydantic's ValidationError included) when it is not one."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return RunFile.model_validate(data)
