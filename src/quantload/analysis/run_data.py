"""Reading a run directory into typed objects and pandas frames, whatever state it is in.

Each JSON file is read through its own model (rundir.run_file, rundir.config_file, rundir.kv_file,
models.manifest, quality.results, roofline.speed_file), and the frames' columns are derived from
the record and stage-event models of quantload.load.records. Nothing here raises for a missing or
unreadable file: each one becomes a `Gap` saying why (taken from run.json's steps when it has
them), so an interrupted run still yields a report.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
from pydantic import BaseModel, ValidationError

from quantload.config import Settings
from quantload.errors import QuantloadError
from quantload.experiments.registry import reported
from quantload.load.limit_file import LimitLine, read_limits
from quantload.load.records import RequestRecord, StageEvent, iter_records, iter_stage_events
from quantload.load.summary import StageSummary
from quantload.models.manifest import Manifest
from quantload.predict.predict_file import PredictFile, load_predict_file
from quantload.quality.results import QualityFile, load_quality_file
from quantload.quality.sensitivity import SensitivityFile, load_sensitivity_file
from quantload.roofline.speed_file import SpeedFile, load_speed_file
from quantload.rundir import (
    KV_JSON,
    LIMITS_JSONL,
    MANIFEST_JSON,
    PREDICT_JSON,
    QUALITY_JSON,
    RECORDS_JSONL,
    SPEED_JSON,
    STAGES_JSONL,
    SUMMARIES_JSONL,
    read_json,
)
from quantload.rundir.config_file import load_config_file
from quantload.rundir.handle import RunDir
from quantload.rundir.jsonl import BadLines, iter_jsonl
from quantload.rundir.kv_file import KvFile, KvResult, load_kv_file
from quantload.rundir.run_file import RunFile, StepRecord, load_run_file

_T = TypeVar("_T")
_SCALARS = (str, int, float, bool)


@dataclass(frozen=True)
class Gap:
    """One missing measurement: which section, what is missing, why, and how to get it."""

    section: str
    what: str
    why: str
    how: str = ""

    def text(self) -> str:
        """One line for the report: 'not measured: WHAT: WHY (HOW)'."""
        line = f"not measured: {self.what}: {self.why}"
        return f"{line} ({self.how})" if self.how else line

    def to_dict(self) -> dict[str, str]:
        return {"section": self.section, "what": self.what, "why": self.why, "how": self.how}


# ----------------------------------------------------------------------------- frame columns


def _value_types(annotation: Any) -> tuple[Any, ...]:
    """The types a field's annotation allows, None left out (`float | None` -> (float,))."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return tuple(a for a in typing.get_args(annotation) if a is not type(None))
    return (annotation,)


def _is_scalar(annotation: Any) -> bool:
    allowed = _value_types(annotation)
    return all(t in _SCALARS or typing.get_origin(t) is typing.Literal for t in allowed)


def scalar_fields(model: type[BaseModel]) -> tuple[str, ...]:
    """The model's fields that hold one value (not lists or objects), in the model's order."""
    return tuple(
        name
        for name, field in model.model_fields.items()
        if name != "schema_" and _is_scalar(field.annotation)
    )


def _fields_typed(model: type[BaseModel], wanted: type, optional: bool = True) -> tuple[str, ...]:
    """The fields of type `wanted` (`wanted | None` too, unless `optional` is False)."""
    return tuple(
        name
        for name, field in model.model_fields.items()
        if (_value_types(field.annotation) == (wanted,) if optional else field.annotation is wanted)
    )


# The server's own timings, taken out of each record's `timings` object (llama-server's keys).
SERVER_TIMINGS: tuple[str, ...] = (
    "prompt_ms", "predicted_ms", "prompt_n", "cache_n", "draft_n", "draft_n_accepted",
)  # fmt: skip
# Every single-valued field of a record, then when its stream ended and the server's timings.
RECORD_COLUMNS: tuple[str, ...] = (*scalar_fields(RequestRecord), "end_unix_s", *SERVER_TIMINGS)
# Flags that are always true or false (a `bool | None` field keeps its None).
RECORD_FLAGS: tuple[str, ...] = _fields_typed(RequestRecord, bool, optional=False)
# Float columns (NaN where missing): the float fields, the token counts and the server timings.
NUMERIC_RECORD_COLUMNS: tuple[str, ...] = (
    *_fields_typed(RequestRecord, float),
    *(name for name in _fields_typed(RequestRecord, int) if name.endswith("_tokens")),
    "end_unix_s",
    *SERVER_TIMINGS,
)
STAGE_COLUMNS: tuple[str, ...] = scalar_fields(StageEvent)


# ----------------------------------------------------------------------------- the run


@dataclass(frozen=True)
class RunData:
    """Everything a run directory holds that the report reads; None where a file is absent or unreadable."""

    run_dir: Path
    state: RunFile | None  # run.json: the run's own account of its steps, servers and Prometheus
    settings: Settings | None  # config.json
    manifest: Manifest | None
    quality: QualityFile | None
    speed: SpeedFile | None
    kv: KvFile | None
    records: pd.DataFrame  # RECORD_COLUMNS
    stages: pd.DataFrame  # STAGE_COLUMNS
    gaps: tuple[Gap, ...]
    reading_notes: tuple[str, ...]
    limits: tuple[LimitLine, ...] = ()  # limits.jsonl: one line per limit search
    itl_by_request: dict[str, list[float]] | None = None  # gap_experiments()' gaps, by request_key
    summaries: Mapping[str, StageSummary] = field(default_factory=dict)  # summaries.jsonl, by stage id
    sensitivity: SensitivityFile | None = None  # sensitivity.json: the tensor groups that resist
    predict: PredictFile | None = None  # predict.json: each file's limit predicted before the load

    @property
    def run_id(self) -> str:
        """run.json's id, else the records', else the folder name."""
        if self.state is not None and self.state.run_id is not None:
            return self.state.run_id
        if not self.records.empty:
            return str(self.records["run_id"].iloc[0])
        return self.run_dir.name

    @property
    def kv_results(self) -> dict[str, KvResult]:
        """kv.json's results by quantization; empty when there is no kv.json."""
        return dict(self.kv.results) if self.kv is not None else {}

    def configured_quants(self) -> tuple[str, ...]:
        return tuple(self.settings.prepare.quants) if self.settings is not None else ()

    def configured_users(self) -> tuple[int, ...]:
        return tuple(self.settings.load.users) if self.settings is not None else ()

    def quants(self) -> list[str]:
        """Every file the run names anywhere: the manifest's files largest first (the one order of
        every table, figure, verdict and plan), then any other the configuration or a result names."""
        candidates: list[str] = self.manifest.ordered_labels() if self.manifest is not None else []
        candidates += list(self.configured_quants())
        candidates += list(self.quality.results) if self.quality else []
        candidates += list(self.speed.results) if self.speed else []
        candidates += list(self.kv_results)
        if not self.records.empty:
            candidates += [str(q) for q in dict.fromkeys(self.records["quant"].tolist())]
        return list(dict.fromkeys(candidates))

    def _steps(self, name: str, quant: str | None) -> list[StepRecord]:
        steps = [s for s in self.state.steps if s.name == name] if self.state is not None else []
        if quant is not None:
            steps = [s for s in steps if s.quant in (quant, None)]
        return steps

    def step_trouble(self, name: str, quant: str | None) -> str | None:
        """The steps of `name` (for `quant`) that did not end ok, in words; None when all did."""
        troubles = [_step_trouble(name, s) for s in self._steps(name, quant) if s.status != "ok"]
        return "; ".join(troubles) or None

    def step_why(self, name: str, quant: str | None, what_file: str) -> str:
        """Why a step's output (the whole file, or one quant's entry) is missing, from run.json."""
        steps = self._steps(name, quant)
        missing = f"{what_file} has no entry for {quant}" if quant else f"{what_file} is absent"
        status = self.state.status if self.state is not None else None
        stopped = status in ("running", "interrupted", "failed")
        state = "is still running or stopped" if status == "running" else str(status)
        if steps:
            trouble = self.step_trouble(name, quant)
            if trouble:
                return trouble
            if stopped:
                return f"the run {state} before {what_file} was written"
            return f"{missing} although run.json records the {name} step as done (moved or deleted?)"
        if stopped:
            return f"the run {state} before the {name} step"
        if self.state is None:
            return f"{missing} and there is no run.json to say why"
        return f"{missing} and run.json does not mention a {name} step"


def _step_trouble(name: str, step: StepRecord) -> str:
    """One step that did not end ok, in words."""
    label = f"the {name} step" + (f" for {step.quant}" if step.quant else "")
    error = step.error or "no reason recorded"
    if step.status == "failed":
        return f"{label} failed: {error}"
    if step.status == "skipped":
        return f"{label} was skipped: {error}"
    if step.status == "running":
        return f"{label} was still running when the run stopped"
    return f"{label} ended as {step.status!r}"


# ----------------------------------------------------------------------------- reading


def _frame(rows: list[dict[str, Any]], columns: Sequence[str]) -> pd.DataFrame:
    return pd.DataFrame(rows, columns=list(columns))


def _record_row(record: RequestRecord) -> dict[str, Any]:
    row: dict[str, Any] = {name: getattr(record, name) for name in scalar_fields(RequestRecord)}
    row["end_unix_s"] = record.sent_unix_s + record.e2e_s if record.e2e_s is not None else None
    timings = record.timings or {}
    row.update({name: timings.get(name) for name in SERVER_TIMINGS})
    return row


def gap_experiments() -> frozenset[str]:
    """The experiments whose every inter-token gap the report pools (the frame keeps only a
    summary): those whose own part of the report asks for them (ExperimentReport.itl_gaps)."""
    return frozenset(experiment.name for experiment, part in reported() if part.itl_gaps)


def request_key(stage_id: object, sent_unix_s: float) -> str:
    """A record's key among the gap lists: its stage and its send time."""
    return f"{stage_id}/{sent_unix_s:.6f}"


def read_records(
    path: Path, gaps: dict[str, list[float]] | None = None, bad: BadLines | None = None
) -> pd.DataFrame:
    """The records as a frame (RECORD_COLUMNS); lines that cannot be read are counted in `bad`;
    `gaps`, when given, gets the inter-token gaps of every record of `gap_experiments()` by
    `request_key`."""
    pooled = gap_experiments() if gaps is not None else frozenset()
    rows = []
    for record in iter_records(path, bad):
        rows.append(_record_row(record))
        if gaps is not None and record.experiment in pooled and record.itl_s:
            gaps[request_key(record.stage_id, record.sent_unix_s)] = list(record.itl_s)
    frame = _frame(rows, RECORD_COLUMNS)
    for column in RECORD_FLAGS:
        frame[column] = frame[column].astype(bool)
    for column in NUMERIC_RECORD_COLUMNS:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(float)
    return frame


def read_stages(path: Path, bad: BadLines | None = None) -> pd.DataFrame:
    """The stage events as a frame (STAGE_COLUMNS); lines that cannot be read are counted in `bad`."""
    rows = [{name: getattr(event, name) for name in STAGE_COLUMNS} for event in iter_stage_events(path, bad)]
    return _frame(rows, STAGE_COLUMNS)


def read_summaries(path: Path, bad: BadLines | None = None) -> dict[str, StageSummary]:
    """The stage summaries by stage id (a later line for the same stage wins); lines that cannot be
    read are counted in `bad`."""
    return {summary.stage_id: summary for summary in iter_jsonl(path, StageSummary.from_json_line, bad)}


def _first_line(error: Exception) -> str:
    if isinstance(error, QuantloadError):
        return error.problem
    return str(error).splitlines()[0] if str(error) else type(error).__name__


def _read_model(
    path: Path, loader: Callable[[Path], _T], section: str, what: str, gaps: list[Gap], why_absent: str
) -> _T | None:
    """The file read through its model, or None and a gap saying why."""
    if not path.is_file():
        gaps.append(Gap(section, what, why_absent))
        return None
    try:
        return loader(path)
    except (QuantloadError, ValidationError, ValueError, TypeError, OSError) as error:
        gaps.append(Gap(section, what, f"the file could not be read: {_first_line(error)}"))
        return None


def _read_note(path: Path, loader: Callable[[Path], _T], consequence: str, notes: list[str]) -> _T | None:
    """The file read through its model, or None and a reading note saying what that leaves unknown."""
    if not path.is_file():
        notes.append(f"{path.name}: {path.name} is absent; {consequence}")
        return None
    try:
        return loader(path)
    except (ValidationError, ValueError, TypeError, OSError) as error:
        notes.append(f"{path.name}: {path.name} could not be read ({_first_line(error)}); {consequence}")
        return None


def _load_manifest(path: Path) -> Manifest:
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return Manifest.from_json(data)


def load_run(run_dir: Path) -> RunData:
    """Read every file of `run_dir` that exists; missing ones become gaps."""
    files = RunDir(run_dir)
    gaps: list[Gap] = []
    notes: list[str] = []
    state = _read_note(files.run_file_path, load_run_file, "the run's steps and status are unknown", notes)
    config = _read_note(files.config_path, load_config_file, "settings of the run are unknown", notes)
    partial = RunData(run_dir, state, None, None, None, None, None, pd.DataFrame(), pd.DataFrame(), (), ())

    def read(path: Path, loader: Callable[[Path], _T], section: str, what: str, step: str) -> _T | None:
        return _read_model(path, loader, section, what, gaps, partial.step_why(step, None, path.name))

    manifest = read(
        files.manifest_path, _load_manifest, "model files", f"model files ({MANIFEST_JSON})", "prepare"
    )
    quality = read(files.quality_path, load_quality_file, "quality", f"quality ({QUALITY_JSON})", "quality")
    speed = read(files.speed_path, load_speed_file, "speed", f"speed ({SPEED_JSON})", "speed")
    kv = read(files.kv_path, load_kv_file, "kv", f"KV cache check ({KV_JSON})", "kv")
    itl: dict[str, list[float]] = {}
    bad = {name: BadLines(name) for name in (RECORDS_JSONL, STAGES_JSONL, LIMITS_JSONL, SUMMARIES_JSONL)}
    records = read_records(files.records_path, itl, bad[RECORDS_JSONL])
    stages = read_stages(files.stages_path, bad[STAGES_JSONL])
    limits = tuple(read_limits(files.limits_path, bad[LIMITS_JSONL]))
    summaries = read_summaries(files.summaries_path, bad[SUMMARIES_JSONL])
    if records.empty:
        gaps.append(Gap("load", "load test (records.jsonl)", partial.step_why("load", None, RECORDS_JSONL)))
    notes += [note for tally in bad.values() if (note := tally.note()) is not None]
    predict = _read_predict(files.predict_path, partial, gaps, notes)
    return RunData(
        run_dir=run_dir,
        state=state,
        settings=config.settings if config is not None else None,
        manifest=manifest,
        quality=quality,
        speed=speed,
        kv=kv,
        records=records,
        stages=stages,
        gaps=tuple(gaps),
        reading_notes=tuple(notes),
        limits=limits,
        itl_by_request=itl,
        summaries=summaries,
        sensitivity=_read_sensitivity(files.sensitivity_path, notes),
        predict=predict,
    )


def _read_sensitivity(path: Path, notes: list[str]) -> SensitivityFile | None:
    """sensitivity.json when the run scanned (absent otherwise: the scan is optional)."""
    if not path.is_file():
        return None
    try:
        return load_sensitivity_file(path)
    except (ValidationError, ValueError, OSError) as error:
        notes.append(f"{path.name} could not be read ({_first_line(error)}); the scan is left out")
        return None


def _read_predict(path: Path, partial: RunData, gaps: list[Gap], notes: list[str]) -> PredictFile | None:
    """predict.json when the run predicted. Absent: a gap where run.json records a predict step that
    was not skipped (nothing where the run had none, e.g. a folder of `quantload load`, or skipped
    it); unreadable: a note."""
    if not path.is_file():
        steps = [step for step in partial.state.steps if step.name == "predict"] if partial.state else []
        if any(step.status != "skipped" for step in steps):  # a step turned off or skipped says so itself
            why = partial.step_why("predict", None, PREDICT_JSON)
            gaps.append(Gap("prediction", f"the prediction before the load ({PREDICT_JSON})", why))
        return None
    try:
        return load_predict_file(path)
    except (ValidationError, ValueError, OSError) as error:
        notes.append(f"{path.name} could not be read ({_first_line(error)}); the prediction is left out")
        return None
