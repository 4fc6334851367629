"""The pieces that run inside a Locust process, driven here without Locust: the stage controller
over a stand-in runner whose users are greenlets, the driving process's record sink and its
circuit breaker, the local ticket book, the health monitor and the master-worker messages.

gevent is imported (its hub runs the greenlets) but never monkey-patches this process; nothing
here imports locust.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gevent
import pytest

from load_api import sweep_of
from quantload.config import LoadSettings
from quantload.load.in_locust.health import HealthMonitor
from quantload.load.in_locust.messages import ClientFailed, HealthWindow, RecordLine, TicketReply, TicketWant
from quantload.load.in_locust.sinks import DriverSink
from quantload.load.in_locust.stages import StageController
from quantload.load.in_locust.ticket_sources import LocalTickets
from quantload.load.measure import build_record
from quantload.load.metrics import LoadMetrics
from quantload.load.prompts import Prompt
from quantload.load.records import JsonlAppender, RequestRecord, iter_records, iter_stage_events
from quantload.load.stream_result import StreamResult
from quantload.load.tickets import StageTracker, Ticket, stage_tickets
from quantload.served import ServedTarget

TARGET = ServedTarget(name="srv", quant="Q8_0", model="m", url="http://127.0.0.1:1")
PROMPTS = [Prompt(f"p{i}", f"prompt {i}", 2) for i in range(3)]


def finished(ticket: Ticket, ok: bool = True) -> RequestRecord:
    """What a user records for a ticket: a stream of two tokens, or a refused connection."""
    if not ok:
        return build_record(ticket, StreamResult(sent_unix_s=1.0, error_class="connect_refused"), 0.0, "h:1")
    result = StreamResult(
        sent_unix_s=1.0, sent_perf_s=0.0, status=200, ttfb_s=0.001, content_times_s=[0.01, 0.02], end_s=0.03,
        done_seen=True, finish_reason="length", usage={"completion_tokens": 2, "prompt_tokens": 3},
    )  # fmt: skip
    return build_record(ticket, result, 0.0, "h:1")


Behaviour = Callable[[Ticket], RequestRecord | None]  # None: the user never finishes it


class StandInRunner:
    """Quacks like a Locust local runner: `start` keeps `user_count` greenlet users taking tickets."""

    def __init__(self, tickets: LocalTickets, sink: DriverSink, behave: Behaviour) -> None:
        self.tickets, self.sink, self.behave = tickets, sink, behave
        self.users: list[gevent.Greenlet] = []
        self.quit_called = False

    @property
    def user_count(self) -> int:
        return len(self.users)

    def start(self, users: int, spawn_rate: float) -> None:
        while len(self.users) < users:
            self.users.append(gevent.spawn(self._user))
        while len(self.users) > users:
            self.users.pop().kill()

    def _user(self) -> None:
        while (ticket := self.tickets.take()) is not None:
            record = self.behave(ticket)
            if record is None:
                gevent.sleep(3600)
            else:
                self.sink.put(record)
            gevent.sleep(0)

    def quit(self) -> None:
        self.quit_called = True
        gevent.killall(self.users)


class StandInEnvironment:
    def __init__(self) -> None:
        self.runner: Any = None


def drive(tmp_path: Path, behave: Behaviour, **load: Any) -> tuple[StageController, StandInRunner]:
    """A two-stage sweep (1 then 2 users, three prompts, one warm-up) through a real controller."""
    settings = LoadSettings.model_validate({"users": (1, 2), "repeats": 1, "warmup_requests": 1, **load})
    # an aborted stage waits its grace for the requests it handed out; the stand-in's hung ones never end
    plan = sweep_of(settings, TARGET, PROMPTS, "run", "inv").model_copy(update={"abort_grace_s": 0.5})
    tickets = LocalTickets()
    sink = DriverSink(JsonlAppender(tmp_path / "records.jsonl"))
    environment = StandInEnvironment()
    environment.runner = StandInRunner(tickets, sink, behave)
    controller = StageController(
        environment, plan, tickets.book, sink, JsonlAppender(tmp_path / "stages.jsonl"), LoadMetrics()  # type: ignore[arg-type]
    )
    gevent.spawn(controller.run).join(timeout=30)
    return controller, environment.runner


def ends(tmp_path: Path) -> list[tuple[int | None, str, int]]:
    return [
        (e.stage_users, e.status, e.requests_done)
        for e in iter_stage_events(tmp_path / "stages.jsonl")
        if e.event == "stage_end"
    ]


def test_the_controller_runs_each_stage_to_its_last_record_and_stops_the_runner(tmp_path: Path) -> None:
    controller, runner = drive(tmp_path, finished)
    events = [(e.event, e.stage_users) for e in iter_stage_events(tmp_path / "stages.jsonl")]
    assert events == [("stage_start", 1), ("stage_end", 1), ("stage_start", 2), ("stage_end", 2)]
    assert ends(tmp_path) == [(1, "ok", 3), (2, "ok", 3)]
    records = list(iter_records(tmp_path / "records.jsonl"))
    assert len(records) == 8 and sum(r.warmup for r in records) == 2  # one warm-up per stage
    assert runner.quit_called and controller.abort_reason is None


def test_failures_in_a_row_trip_the_breaker_and_abort_the_later_stages(tmp_path: Path) -> None:
    controller, _ = drive(tmp_path, lambda ticket: finished(ticket, ok=ticket.warmup), max_consecutive_errors=2)
    assert controller.abort_reason is not None
    (first, second) = [e for e in iter_stage_events(tmp_path / "stages.jsonl") if e.event == "stage_end"]
    assert first.status == "failed" and "2 requests in a row failed" in (first.reason or "")
    assert (second.status, second.reason) == ("aborted", first.reason)


def test_a_request_that_never_ends_costs_the_stage_its_timeout(tmp_path: Path) -> None:
    hang: Behaviour = lambda ticket: finished(ticket) if ticket.warmup or ticket.prompt_id != "p1" else None  # noqa: E731
    drive(tmp_path, hang, stage_timeout_s=0.5)
    (first, second) = [e for e in iter_stage_events(tmp_path / "stages.jsonl") if e.event == "stage_end"]
    assert first.status == "failed" and (first.reason or "").startswith("stage timeout after 0.5 s")
    assert second.status == "aborted"


def test_a_failure_of_the_client_itself_ends_the_stage_with_its_cause(tmp_path: Path) -> None:
    holder: dict[str, StageController] = {}

    def fail_once(ticket: Ticket) -> RequestRecord | None:
        if not ticket.warmup:
            holder["controller"].client_failed("TypeError: boom")
            return None
        return finished(ticket)

    settings = LoadSettings(users=(1,), repeats=1, warmup_requests=1)
    plan = sweep_of(settings, TARGET, PROMPTS, "run", "inv").model_copy(update={"abort_grace_s": 0.5})
    tickets = LocalTickets()
    sink = DriverSink(JsonlAppender(tmp_path / "records.jsonl"))
    environment = StandInEnvironment()
    environment.runner = StandInRunner(tickets, sink, fail_once)
    controller = StageController(
        environment, plan, tickets.book, sink, JsonlAppender(tmp_path / "stages.jsonl"), LoadMetrics()  # type: ignore[arg-type]
    )
    holder["controller"] = controller
    gevent.spawn(controller.run).join(timeout=30)
    (end,) = [e for e in iter_stage_events(tmp_path / "stages.jsonl") if e.event == "stage_end"]
    assert end.status == "failed" and end.reason == "the load client failed: TypeError: boom"


def test_the_sink_counts_a_workers_lines_and_trips_once(tmp_path: Path) -> None:
    plan = sweep_of(LoadSettings(users=(1,), repeats=1), TARGET, PROMPTS, "run", "inv")
    plan_tickets = _stage_tickets(plan)
    trips: list[int] = []
    sink = DriverSink(JsonlAppender(tmp_path / "records.jsonl"))
    sink.tracker = StageTracker("inv-0", 3, False, 2)
    sink.on_trip = lambda: trips.append(1)
    bad = [finished(t, ok=False) for t in plan_tickets]
    sink.put_line(bad[0].to_json_line())  # a worker's record arrives as its line
    sink.put(bad[1])
    sink.put(bad[2])
    assert sink.tracker.tripped and trips == [1] and sink.tracker.done == 3
    assert [r.error_class for r in iter_records(tmp_path / "records.jsonl")] == ["connect_refused"] * 3


def _stage_tickets(plan: Any) -> list[Ticket]:
    return stage_tickets(plan, plan.stages[0], warmup=False)


def test_local_tickets_serve_waiting_users_in_turn_and_end_with_none() -> None:
    plan = sweep_of(LoadSettings(users=(1,), repeats=1), TARGET, PROMPTS, "run", "inv")
    tickets = LocalTickets()
    taken: list[tuple[int, str | None]] = []

    def user(number: int) -> None:
        while (ticket := tickets.take()) is not None:
            taken.append((number, ticket.prompt_id))
            gevent.sleep(0)
        taken.append((number, None))

    users = [gevent.spawn(user, n) for n in range(2)]
    gevent.sleep(0)
    tickets.book.add(_stage_tickets(plan))
    gevent.sleep(0.05)
    tickets.book.close()
    gevent.joinall(users, timeout=5)
    assert sorted(p for _, p in taken if p) == ["p0", "p1", "p2"]
    assert sorted(n for n, p in taken if p is None) == [0, 1]


def test_the_health_monitor_reports_quarter_second_windows() -> None:
    windows: list[HealthWindow] = []
    monitor = HealthMonitor(windows.append)
    runner = gevent.spawn(monitor.run)
    gevent.sleep(0.8)
    runner.kill()
    assert windows, "no window in 0.8 s"
    assert all(w.wall_s >= 0.25 and w.cpu_s >= 0 and w.lags_s and min(w.lags_s) >= 0 for w in windows)


def test_messages_go_to_and_from_their_data() -> None:
    plan = sweep_of(LoadSettings(users=(1,), repeats=1), TARGET, PROMPTS, "run", "inv")
    ticket = _stage_tickets(plan)[0]
    for message in (
        TicketWant(3),
        TicketReply(3, ticket),
        TicketReply(4, None),
        RecordLine(finished(ticket).to_json_line()),
        HealthWindow("h:1", 0.1, 0.25, (0.001, 0.002)),
        ClientFailed("h:1", "boom"),
    ):
        assert type(message).from_data(message.to_data()) == message


def test_none_of_this_imported_locust() -> None:
    assert "locust" not in sys.modules or pytest.skip("another test of this session imported locust")
