"""A run directory as the load side uses it: a typed append and read per file.

    run_dir = RunDir(path)
    run_dir.append_summary(summary)      # summaries.jsonl
    run_dir.summaries()                  # every stage summary, in the order written
    run_dir.append_limit(line)           # limits.jsonl
    run_dir.stage_events(), run_dir.records()

Appends are one `write` per line on an O_APPEND descriptor (quantload.load.records.JsonlAppender),
so nothing already written is lost when a run stops; reads skip a torn last line.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from quantload.load.limit_file import LimitLine, read_limits
from quantload.load.records import JsonlAppender, RequestRecord, StageEvent, iter_records, iter_stage_events
from quantload.load.summary import StageSummary
from quantload.rundir import (
    KV_JSON,
    LIMITS_JSONL,
    LOGS_DIR,
    RECORDS_JSONL,
    SOAK_JSONL,
    STAGES_JSONL,
    SUMMARIES_JSONL,
)
from quantload.rundir.jsonl import iter_jsonl

LOAD_PLANS_DIR = "load-plans"


@dataclass(frozen=True)
class RunDir:
    """One run directory (see quantload.rundir for its layout)."""

    path: Path

    @property
    def records_path(self) -> Path:
        return self.path / RECORDS_JSONL

    @property
    def stages_path(self) -> Path:
        return self.path / STAGES_JSONL

    @property
    def summaries_path(self) -> Path:
        return self.path / SUMMARIES_JSONL

    @property
    def limits_path(self) -> Path:
        return self.path / LIMITS_JSONL

    @property
    def kv_path(self) -> Path:
        return self.path / KV_JSON

    @property
    def soak_path(self) -> Path:
        return self.path / SOAK_JSONL

    @property
    def logs(self) -> Path:
        """The folder of every child process's log (made on first use)."""
        folder = self.path / LOGS_DIR
        folder.mkdir(parents=True, exist_ok=True)
        return folder

    def plan_path(self, invocation: str) -> Path:
        """Where the load plan of one invocation is written."""
        return self.path / LOAD_PLANS_DIR / f"{invocation}.json"

    def append_summary(self, summary: StageSummary) -> None:
        """One stage's summary, appended to summaries.jsonl."""
        _append(self.summaries_path, summary.to_json_line())

    def summaries(self) -> Iterator[StageSummary]:
        """Every stage summary written so far, in order."""
        return iter_jsonl(self.summaries_path, StageSummary.from_json_line)

    def append_limit(self, line: LimitLine) -> None:
        """One finished limit search, appended to limits.jsonl."""
        _append(self.limits_path, line.model_dump_json(by_alias=True))

    def limits(self) -> list[LimitLine]:
        return read_limits(self.limits_path)

    def records(self) -> Iterator[RequestRecord]:
        return iter_records(self.records_path)

    def stage_events(self) -> Iterator[StageEvent]:
        return iter_stage_events(self.stages_path)


def _append(path: Path, line: str) -> None:
    appender = JsonlAppender(path)
    try:
        appender.append_line(line)
    finally:
        appender.close()
