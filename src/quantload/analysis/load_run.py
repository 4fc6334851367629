"""Reading a run directory into typed objects and pandas frames, whatever state it is in.

Nothing here raises for a missing or unreadable file: each one becomes a `Gap` saying why (taken
from run.json's steps when it has them), so an interrupted run still yields a report.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pandas as pd
from pydantic import ValidationError

from quantload.analysis.gaps import Gap
from quantload.errors import QuantloadError
from quantload.load.records import RequestRecord, StageEvent
from quantload.models.manifest import Manifest
from quantload.quality.results import QualityFile, load_quality_file
from quantload.roofline.speed_file import SpeedFile, load_speed_file
from quantload.rundir import (
    CONFIG_JSON,
    KV_JSON,
    MANIFEST_JSON,
    QUALITY_JSON,
    RECORDS_JSONL,
    RUN_JSON,
    SPEED_JSON,
    STAGES_JSONL,
)

_T = TypeVar("_T")
RECORD_COLUMNS: tuple[str, ...] = (
    "run_id",
    "server",
    "quant",
    "model",
    "experiment",
    "stage_id",
    "stage_users",
    "stage_rate_rps",
    "repeat",
    "warmup",
    "cache_prompt",
    "prompt_id",
    "worker",
    "intended_unix_s",
    "sent_unix_s",
    "end_unix_s",
    "lag_s",
    "ttft_s",
    "ttft_from_intended_s",
    "e2e_s",
    "e2e_from_intended_s",
    "tpot_s",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "prompt_ms",
    "predicted_ms",
    "prompt_n",
    "cache_n",
    "ok",
    "within_deadline",
    "error_class",
)
NUMERIC_RECORD_COLUMNS: tuple[str, ...] = (
    "stage_rate_rps", "intended_unix_s", "sent_unix_s", "end_unix_s", "lag_s", "ttft_s",
    "ttft_from_intended_s", "e2e_s", "e2e_from_intended_s", "tpot_s", "prompt_tokens",
    "completion_tokens", "cached_tokens", "prompt_ms", "predicted_ms", "prompt_n", "cache_n",
)  # fmt: skip
STAGE_COLUMNS: tuple[str, ...] = (
    "event",
    "unix_s",
    "run_id",
    "server",
    "quant",
    "experiment",
    "stage_id",
    "stage_index",
    "stage_users",
    "stage_rate_rps",
    "repeat",
    "cache_prompt",
    "requests_planned",
    "status",
    "reason",
    "prefix_tokens",
    "server_state",
    "client_cpu_frac",
    "loop_lag_p99_s",
    "loop_lag_max_s",
    "client_saturated",
)


@dataclass(frozen=True)
class RunData:
    """Everything a run directory holds that the report reads."""

    run_dir: Path
    run: dict[str, Any]
    settings: dict[str, Any]
    manifest: Manifest | None
    quality: QualityFile | None
    speed: SpeedFile | None
    kv: dict[str, Any]
    records: pd.DataFrame
    stages: pd.DataFrame
    gaps: tuple[Gap, ...]
    reading_notes: tuple[str, ...]

    @property
    def run_id(self) -> str:
        """run.json's id, else the records', else the folder name."""
        if isinstance(self.run.get("run_id"), str):
            return str(self.run["run_id"])
        if not self.records.empty:
            return str(self.records["run_id"].iloc[0])
        return self.run_dir.name

    def setting(self, section: str, key: str) -> Any:
        """A value of the run's resolved configuration, or None when not recorded."""
        values = self.settings.get(section)
        return values.get(key) if isinstance(values, dict) else None

    def quants(self) -> list[str]:
        """Every quantization the run names anywhere, in the configured order first."""
        seen: list[str] = []
        candidates: list[Any] = list(self.setting("model", "quants") or [])
        if self.manifest is not None:
            candidates += list(self.manifest.files)
        candidates += list(self.quality.results) if self.quality else []
        candidates += list(self.speed.results) if self.speed else []
        candidates += list(self.kv)
        if not self.records.empty:
            candidates += list(dict.fromkeys(self.records["quant"].tolist()))
        for quant in candidates:
            if isinstance(quant, str) and quant not in seen:
                seen.append(quant)
        return seen

    def step_trouble(self, name: str, quant: str | None) -> str | None:
        """The steps of `name` (for `quant`) that did not end ok, in words; None when all did."""
        steps = [s for s in self.run.get("steps", []) if isinstance(s, dict) and s.get("name") == name]
        if quant is not None:
            steps = [s for s in steps if s.get("quant") in (quant, None)]
        troubles = [_step_trouble(name, s) for s in steps if s.get("status") != "ok"]
        return "; ".join(troubles) or None

    def step_why(self, name: str, quant: str | None, what_file: str) -> str:
        """Why a step's output (the whole file, or one quant's entry) is missing, from run.json."""
        steps = [s for s in self.run.get("steps", []) if isinstance(s, dict) and s.get("name") == name]
        if quant is not None:
            steps = [s for s in steps if s.get("quant") in (quant, None)]
        missing = f"{what_file} has no entry for {quant}" if quant else f"{what_file} is absent"
        status = self.run.get("status")
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
        if not self.run:
            return f"{missing} and there is no run.json to say why"
        return f"{missing} and run.json does not mention a {name} step"


def _step_trouble(name: str, step: dict[str, Any]) -> str:
    """One step that did not end ok, in words."""
    label = f"the {name} step" + (f" for {step['quant']}" if step.get("quant") else "")
    status, error = step.get("status"), step.get("error") or "no reason recorded"
    if status == "failed":
        return f"{label} failed: {error}"
    if status == "skipped":
        return f"{label} was skipped: {error}"
    if status == "running":
        return f"{label} was still running when the run stopped"
    return f"{label} ended as {status!r}"


def _read_json(path: Path) -> tuple[Any, str | None]:
    """(data, None), or (None, why) for an absent or unreadable file."""
    if not path.is_file():
        return None, f"{path.name} is absent"
    try:
        return json.loads(path.read_text(encoding="utf-8")), None
    except (OSError, ValueError) as error:
        return None, f"{path.name} could not be read ({str(error).splitlines()[0]})"


def _record_row(record: RequestRecord) -> dict[str, Any]:
    timings = record.timings or {}
    end = record.sent_unix_s + record.e2e_s if record.e2e_s is not None else None
    row: dict[str, Any] = {name: getattr(record, name, None) for name in RECORD_COLUMNS}
    row.update(
        end_unix_s=end,
        prompt_ms=timings.get("prompt_ms"),
        predicted_ms=timings.get("predicted_ms"),
        prompt_n=timings.get("prompt_n"),
        cache_n=timings.get("cache_n"),
    )
    return row


def _jsonl_lines(path: Path) -> list[str]:
    if not path.is_file():
        return []
    with path.open(encoding="utf-8", errors="replace") as handle:
        return [line for line in handle if line.strip()]


def read_records(path: Path) -> tuple[pd.DataFrame, int]:
    """The records as a frame (RECORD_COLUMNS) and how many lines could not be read."""
    rows, bad = [], 0
    for line in _jsonl_lines(path):
        try:
            rows.append(_record_row(RequestRecord.from_json_line(line)))
        except (ValueError, TypeError, KeyError):
            bad += 1
    frame = pd.DataFrame(rows, columns=list(RECORD_COLUMNS))
    for column in ("warmup", "cache_prompt", "ok", "within_deadline"):
        frame[column] = frame[column].astype(bool)
    for column in NUMERIC_RECORD_COLUMNS:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(float)
    return frame, bad


def read_stages(path: Path) -> tuple[pd.DataFrame, int]:
    """The stage events as a frame (STAGE_COLUMNS) and how many lines could not be read."""
    rows, bad = [], 0
    for line in _jsonl_lines(path):
        try:
            event = StageEvent.from_json_line(line)
        except (ValueError, TypeError, KeyError):
            bad += 1
            continue
        rows.append({name: getattr(event, name, None) for name in STAGE_COLUMNS})
    return pd.DataFrame(rows, columns=list(STAGE_COLUMNS)), bad


def _typed(
    path: Path, loader: Callable[[Path], _T], section: str, gaps: list[Gap], why_absent: str
) -> _T | None:
    what = f"{section} ({path.name})"
    if not path.is_file():
        gaps.append(Gap(section, what, why_absent))
        return None
    try:
        return loader(path)
    except (QuantloadError, ValidationError, ValueError, TypeError, OSError) as error:
        text = error.problem if isinstance(error, QuantloadError) else str(error).splitlines()[0]
        gaps.append(Gap(section, what, f"the file could not be read: {text}"))
        return None


def _load_manifest(path: Path) -> Manifest:
    data, problem = _read_json(path)
    if not isinstance(data, dict):
        raise ValueError(problem or "not a JSON object")
    return Manifest.from_json(data)


def load_run(run_dir: Path) -> RunData:
    """Read every file of `run_dir` that exists; missing ones become gaps."""
    gaps: list[Gap] = []
    notes: list[str] = []
    run, problem = _read_json(run_dir / RUN_JSON)
    if not isinstance(run, dict):
        run = {}
        notes.append(f"run.json: {problem or 'not a JSON object'}; the run's steps and status are unknown")
    config, problem = _read_json(run_dir / CONFIG_JSON)
    settings: dict[str, Any] = {}
    if isinstance(config, dict):
        inner = config.get("settings", config)
        settings = inner if isinstance(inner, dict) else {}
    else:
        notes.append(f"config.json: {problem or 'not a JSON object'}; settings of the run are unknown")
    partial = RunData(run_dir, run, settings, None, None, None, {}, pd.DataFrame(), pd.DataFrame(), (), ())
    manifest = _typed(
        run_dir / MANIFEST_JSON,
        _load_manifest,
        "model files",
        gaps,
        partial.step_why("prepare", None, MANIFEST_JSON),
    )
    quality = _typed(
        run_dir / QUALITY_JSON,
        load_quality_file,
        "quality",
        gaps,
        partial.step_why("quality", None, QUALITY_JSON),
    )
    speed = _typed(
        run_dir / SPEED_JSON, load_speed_file, "speed", gaps, partial.step_why("speed", None, SPEED_JSON)
    )
    kv_data, problem = _read_json(run_dir / KV_JSON)
    kv: dict[str, Any] = {}
    if isinstance(kv_data, dict) and isinstance(kv_data.get("results"), dict):
        kv = {str(k): v for k, v in kv_data["results"].items() if isinstance(v, dict)}
    else:
        why = partial.step_why("kv", None, KV_JSON) if problem and "absent" in problem else str(problem)
        gaps.append(Gap("kv", "KV cache check (kv.json)", why or "kv.json has no results"))
    records, bad_records = read_records(run_dir / RECORDS_JSONL)
    stages, bad_stages = read_stages(run_dir / STAGES_JSONL)
    if records.empty:
        why = partial.step_why("load", None, RECORDS_JSONL)
        gaps.append(Gap("load", "load test (records.jsonl)", why))
    for count, name in ((bad_records, RECORDS_JSONL), (bad_stages, STAGES_JSONL)):
        if count:
            notes.append(f"{count} line(s) of {name} could not be read (torn or foreign) and were left out")
    return RunData(
        run_dir=run_dir,
        run=run,
        settings=settings,
        manifest=manifest,
        quality=quality,
        speed=speed,
        kv=kv,
        records=records,
        stages=stages,
        gaps=tuple(gaps),
        reading_notes=tuple(notes),
    )
