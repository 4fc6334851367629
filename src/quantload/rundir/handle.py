"""A run directory: the path of each of its files (quantload.rundir.RunPaths) and a typed append
and read of its load files.

    run_dir = RunDir(path)
    run_dir.append_summary(summary)      # summaries.jsonl
    run_dir.summaries()                  # every stage summary, in the order written
    run_dir.append_limit(line)           # limits.jsonl
    run_dir.stage_events(), run_dir.records()
    run_dir.write_load_summary(summaries)  # load-summary.json
    run_dir.records_path, run_dir.kv_path, ...  # every file's path (quantload.rundir.RunPaths)

Appends are one `write` per line on an O_APPEND descriptor (quantload.load.records.JsonlAppender),
so nothing already written is lost when a run stops; reads skip a torn last line.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from quantload.load.limit_file import LimitLine, read_limits
from quantload.load.records import JsonlAppender, RequestRecord, StageEvent, iter_records, iter_stage_events
from quantload.load.summary import StageSummary
from quantload.rundir import RunPaths, write_json_atomic
from quantload.rundir.jsonl import iter_jsonl


@dataclass(frozen=True)
class RunDir(RunPaths):
    """One run directory (see quantload.rundir for its layout): its paths (RunPaths) and the typed
    reads and appends of its load files."""

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

    def write_load_summary(self, summaries: Iterable[StageSummary]) -> None:
        """load-summary.json: every stage summary of one `quantload load`, as one JSON list."""
        write_json_atomic(self.load_summary_path, [summary.to_dict() for summary in summaries])


def _append(path: Path, line: str) -> None:
    appender = JsonlAppender(path)
    try:
        appender.append_line(line)
    finally:
        appender.close()
