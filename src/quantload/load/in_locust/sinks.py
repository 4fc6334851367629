"""Where finished requests go: the driving process appends them, a worker forwards them."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from quantload.load.in_locust.messages import RecordLine
from quantload.load.records import JsonlAppender, RecordOutcome, RequestRecord
from quantload.load.tickets import StageTracker

if TYPE_CHECKING:  # Locust's own types; the module runs without importing locust
    from locust.runners import WorkerRunner


class RecordSink(Protocol):
    """Where finished requests go."""

    def put(self, record: RequestRecord) -> None: ...


class DriverSink:
    """The sink of the process that drives the stages (local runner or master).

    It appends every record to records.jsonl and counts it for the running stage's tracker; when
    the tracker trips (too many failures in a row), `on_trip` runs at once so no more of the
    stage's tickets are handed out. Records from workers arrive as JSON lines and are appended as
    they came, read only for what the tracker needs.
    """

    def __init__(self, records: JsonlAppender | None) -> None:
        self.records = records
        self.tracker: StageTracker | None = None
        self.on_trip: Callable[[], object] | None = None
        self.on_outcome: Callable[[RecordOutcome], object] | None = None  # a decided stage's judge

    def put(self, record: RequestRecord) -> None:
        if self.records is not None:
            self.records.append(record)
        self._count(RecordOutcome.of(record))

    def put_line(self, line: str) -> None:
        """A record that a worker sent as its JSON line."""
        outcome = RecordOutcome.from_json_line(line)
        if self.records is not None:
            self.records.append_line(line)
        self._count(outcome)

    def _count(self, outcome: RecordOutcome) -> None:
        if self.on_outcome is not None:
            self.on_outcome(outcome)
        tracker = self.tracker
        if tracker is None or outcome.stage_id is None:
            return
        tripped = tracker.tripped
        tracker.observe(outcome.stage_id, outcome.warmup, outcome.ok, outcome.error_class)
        if tracker.tripped and not tripped and self.on_trip is not None:
            self.on_trip()  # stop handing out this stage's tickets at once


class WorkerSink:
    """A worker forwards each record to the master."""

    def __init__(self, runner: WorkerRunner) -> None:
        self.runner = runner

    def put(self, record: RequestRecord) -> None:
        self.runner.send_message(RecordLine.NAME, RecordLine(record.to_json_line()).to_data())
