"""What runs inside a Locust process: ticket sources, record sinks, the stage controller.

Only Locust processes import this module (it needs gevent and Locust, and `import locust`
monkey-patches the interpreter): the `quantload.load.locust_process` entry point and the thin
locustfiles. Nothing else in the package imports it.

Roles
- local: one process; the controller, the ticket book and the users live together.
- master: runs the controller and the ticket book, writes records.jsonl and stages.jsonl; sends
  no requests. Workers ask it for tickets (`ql_want` -> `ql_ticket`), send it every record
  (`ql_record`) and a health report four times a second (`ql_health`). Locust merges the
  workers' request statistics (the TTFT/TPOT rows included) on its own.
- worker: runs users; sends every record to the master; serves its own /metrics.

A user takes a ticket, waits until it is due (open loop: the Poisson schedule; closed loop: a
random offset before its first request of a stage, so users do not start in lockstep), sends it
with `stream_request` (which only stamps each event's arrival) and goes straight back for the
next ticket. One recorder greenlet per process, running when the event loop is idle, then works
out what the events said, builds the record, hands it to the sink and (except for warm-ups)
fires three Locust request events, the request itself, "TTFT" and "TPOT", and updates the
Prometheus metrics. Transport failures skip the queue, so the circuit breaker sees them at once.
After each stage's users are spawned every process runs `gc.collect(); gc.freeze()`, so no full
collection of Locust's import-time objects lands on a measured request. A health monitor
measures how late the event loop wakes up and how much CPU the process uses; the stage_end line
says whether the client itself may have been the bottleneck.
"""

from __future__ import annotations

import gc
import logging
import os
import random
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import gevent
from gevent.event import AsyncResult, Event
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from quantload.load.client import (
    ConnectionPool,
    Endpoint,
    StreamResult,
    classify_stream,
    stream_request,
)
from quantload.load.measure import aborted_record, build_record
from quantload.load.metrics import LoadMetrics
from quantload.load.plan import LoadPlan, StagePlan
from quantload.load.records import JsonlAppender, RequestRecord
from quantload.load.tickets import (
    ClientHealth,
    StageContext,
    StageTracker,
    Ticket,
    TicketBook,
    stage_tickets,
)

MSG_WANT = "ql_want"
MSG_TICKET = "ql_ticket"
MSG_RETURN = "ql_return"
MSG_RECORD = "ql_record"
MSG_HEALTH = "ql_health"
MSG_STAGE = "ql_stage"
API_KEY_ENV = "QL_TARGET_API_KEY"
LAG_PERIOD_S = 0.01
HEALTH_WINDOW_S = 0.25
POLL_S = 0.02
RECORD_WAIT_MAX_S = 0.05
SPAWN_TIMEOUT_S = 60.0
WORKERS_TIMEOUT_S = 60.0
REQUEST_TYPE = "POST"
LLM_TYPE = "LLM"

_log = logging.getLogger(__name__)


def process_name() -> str:
    """Who sends: "<host>:<pid>"."""
    return f"{socket.gethostname()}:{os.getpid()}"


class LoadRequestError(Exception):
    """A failed request, as Locust's statistics show it: "<error_class>: <message>"."""


# ---------------------------------------------------------------- ticket sources


class TicketSource(Protocol):
    """Where a user gets its next request; `take` blocks the user's greenlet."""

    def take(self) -> Ticket | None: ...


class LocalTickets:
    """Tickets from a book in this process (local runner)."""

    def __init__(self) -> None:
        self.book: TicketBook[AsyncResult] = TicketBook(lambda waiter, ticket: waiter.set(ticket))

    def take(self) -> Ticket | None:
        waiter = AsyncResult()
        self.book.want(waiter)
        try:
            ticket: Ticket | None = waiter.get()
        except gevent.GreenletExit:
            if not self.book.withdraw(waiter) and waiter.ready() and waiter.value is not None:
                self.book.put_back(waiter.value)
            raise
        return ticket


class MasterTickets:
    """The master's book: waiters are (worker id, request number) answered by message."""

    def __init__(self, runner: MasterRunner) -> None:
        self.runner = runner
        self.book: TicketBook[tuple[str, int]] = TicketBook(self._deliver)
        runner.register_message(MSG_WANT, self._on_want)
        runner.register_message(MSG_RETURN, self._on_return)

    def _deliver(self, waiter: tuple[str, int], ticket: Ticket | None) -> None:
        client_id, want = waiter
        wire = ticket.to_wire() if ticket is not None else None
        self.runner.send_message(MSG_TICKET, {"want": want, "ticket": wire}, client_id)

    def _on_want(self, environment: Environment, msg: Any, **_: Any) -> None:
        self.book.want((str(msg.node_id), int(msg.data["want"])))

    def _on_return(self, environment: Environment, msg: Any, **_: Any) -> None:
        self.book.put_back(Ticket.from_wire(msg.data["ticket"]))


class WorkerTickets:
    """A worker's users ask the master for tickets."""

    def __init__(self, runner: WorkerRunner) -> None:
        self.runner = runner
        self._waiting: dict[int, AsyncResult] = {}
        self._next = 0
        runner.register_message(MSG_TICKET, self._on_ticket)

    def take(self) -> Ticket | None:
        self._next += 1
        want = self._next
        waiter = AsyncResult()
        self._waiting[want] = waiter
        self.runner.send_message(MSG_WANT, {"want": want})
        try:
            ticket: Ticket | None = waiter.get()
        finally:
            self._waiting.pop(want, None)
        return ticket

    def _on_ticket(self, environment: Environment, msg: Any, **_: Any) -> None:
        wire = msg.data["ticket"]
        waiter = self._waiting.pop(int(msg.data["want"]), None)
        if waiter is None:
            if wire is not None:  # the user stopped meanwhile: give the ticket back
                self.runner.send_message(MSG_RETURN, {"ticket": wire})
            return
        waiter.set(Ticket.from_wire(wire) if wire is not None else None)


# ---------------------------------------------------------------- record sinks


class RecordSink(Protocol):
    """Where finished requests go."""

    def put(self, record: RequestRecord) -> None: ...


class RecordHub:
    """The driving process's sink: appends records and counts them for the running stage."""

    def __init__(self, records: JsonlAppender | None) -> None:
        self.records = records
        self.tracker: StageTracker | None = None
        self.on_trip: Callable[[], object] | None = None

    def put(self, record: RequestRecord) -> None:
        if self.records is not None:
            self.records.append(record)
        tracker = self.tracker
        if tracker is not None and record.stage_id is not None:
            tripped = tracker.tripped
            tracker.observe(record.stage_id, record.warmup, record.ok, record.error_class)
            if tracker.tripped and not tripped and self.on_trip is not None:
                self.on_trip()  # stop handing out this stage's tickets at once

    def put_line(self, line: str) -> None:
        self.put(RequestRecord.from_json_line(line))


class WorkerSink:
    """A worker forwards each record to the master."""

    def __init__(self, runner: WorkerRunner) -> None:
        self.runner = runner

    def put(self, record: RequestRecord) -> None:
        self.runner.send_message(MSG_RECORD, {"line": record.to_json_line()})


# ---------------------------------------------------------------- the runtime


@dataclass
class UserState:
    """Per-user memory: the last stage it sent in (for the first-request offset) and its dice."""

    stage_id: str | None = None
    rng: random.Random = field(default_factory=random.Random)


class LoadRuntime:
    """Everything users of one Locust process share."""

    def __init__(
        self,
        environment: Environment,
        tickets: TicketSource,
        sink: RecordSink,
        metrics: LoadMetrics,
        api_key: str | None,
    ) -> None:
        self.environment = environment
        self.tickets = tickets
        self.sink = sink
        self.metrics = metrics
        self.api_key = api_key
        self.worker = process_name()
        self._pools: dict[tuple[str, str, float, str], tuple[Endpoint, ConnectionPool]] = {}
        self._finished: deque[tuple[Ticket, StreamResult, float, str]] = deque()
        self._wake = Event()
        self._recorder = gevent.spawn(self._record_loop)

    def take(self) -> Ticket | None:
        """The next ticket for a user (blocks); None when there will be no more."""
        return self.tickets.take()

    def _pool(self, stage: StageContext) -> tuple[Endpoint, ConnectionPool]:
        key = (stage.url, stage.path, stage.connect_timeout_s, stage.reuse_connections)
        found = self._pools.get(key)
        if found is None:
            endpoint = Endpoint.from_url(stage.url, stage.path, self.api_key)
            reuse = stage.reuse_connections if stage.reuse_connections in ("always", "never") else "auto"
            pool = ConnectionPool(endpoint, stage.connect_timeout_s, reuse)  # type: ignore[arg-type]
            found = self._pools[key] = (endpoint, pool)
        return found

    def execute(self, ticket: Ticket, state: UserState) -> None:
        """Send one ticket when it is due, then queue what happened for the recorder.

        Building the record, writing it and reporting it to Locust and Prometheus happen in one
        recorder greenlet, off the user's path: the user is back for its next ticket at once,
        which keeps the delivered concurrency at the asked one when there are hundreds of users.
        Failed requests are recorded at once instead, so the circuit breaker sees them in time.
        """
        stage = ticket.stage
        endpoint, pool = self._pool(stage)
        request = endpoint.request_bytes(ticket.body())
        if ticket.intended_unix_s is not None:
            delay_s = ticket.intended_unix_s - time.time()
            intended = time.perf_counter() + delay_s
            if delay_s > 0:
                gevent.sleep(delay_s)
        else:
            if state.stage_id != stage.stage_id and not ticket.warmup:
                state.stage_id = stage.stage_id
                offset_s = state.rng.uniform(0.0, stage.first_round_jitter_s)
                if offset_s > 0:
                    gevent.sleep(offset_s)
            intended = time.perf_counter()
        called_unix, called = time.time(), time.perf_counter()
        deadline = gevent.Timeout(stage.request_timeout_s)
        deadline.start()
        try:
            result = stream_request(
                pool, request, stage.request_timeout_s, socket_deadline=False, classify=False
            )
        except gevent.Timeout as fired:
            if fired is not deadline:
                raise
            result = StreamResult(error_class="timeout", error="request deadline passed")
        except gevent.GreenletExit:
            try:
                self.sink.put(aborted_record(ticket, called - intended, self.worker, called_unix))
            except Exception:  # shutting down: the master may be gone already
                _log.debug("could not record an aborted request", exc_info=True)
            raise
        except Exception as error:  # a bug must cost one record, not the user
            _log.exception("request failed inside the client")
            result = StreamResult(error_class="client_error", error=repr(error)[:300])
        finally:
            deadline.cancel()
        if not result.sent_unix_s:
            result.sent_unix_s, result.sent_perf_s = called_unix, called
        lag_s = result.sent_perf_s - intended
        if not result.ok:
            result.end_s = time.perf_counter() - result.sent_perf_s
        if not result.ok:  # transport failures are recorded at once: the breaker must see them
            self._record(ticket, result, lag_s, stage.path)
            return
        self._finished.append((ticket, result, lag_s, stage.path))
        self._wake.set()

    def _record_loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            while self._finished:
                # wait until no arrival on any stream waits to be stamped, but not for long:
                # a saturated loop is never idle, and the stage must still see its records
                with gevent.Timeout(RECORD_WAIT_MAX_S, False):
                    gevent.idle()
                self._record(*self._finished.popleft())

    def _record(self, ticket: Ticket, result: StreamResult, lag_s: float, route: str) -> None:
        try:
            classify_stream(result)
            if not result.ok and result.end_s is None:
                result.end_s = result.content_times_s[-1] if result.content_times_s else 0.0
            record = build_record(ticket, result, lag_s, self.worker)
            self.sink.put(record)
            if not ticket.warmup:
                self._report(record, result, route)
        except Exception:  # one broken record must not stop the recorder
            _log.exception("could not record a finished request")

    def flush(self) -> None:
        """Record whatever finished requests are still queued (at exit)."""
        while self._finished:
            self._record(*self._finished.popleft())

    def _report(self, record: RequestRecord, result: StreamResult, route: str) -> None:
        events = self.environment.events
        elapsed_ms = (result.end_s or 0.0) * 1000.0
        error = None
        if not record.ok:
            error = LoadRequestError(f"{record.error_class}: {record.error}")
        events.request.fire(  # type: ignore[no-untyped-call]
            request_type=REQUEST_TYPE,
            name=route,
            response_time=elapsed_ms,
            response_length=result.bytes_received,
            exception=error,
            context={"stage_id": record.stage_id},
        )
        for row_name, seconds in (("TTFT", record.ttft_s), ("TPOT", record.tpot_s)):
            if record.ok and seconds is not None:
                events.request.fire(  # type: ignore[no-untyped-call]
                    request_type=LLM_TYPE,
                    name=row_name,
                    response_time=seconds * 1000.0,
                    response_length=0,
                    exception=None,
                    context={},
                )
        self.metrics.observe_request(
            (record.server, record.quant, record.experiment),
            "ok" if record.ok else (record.error_class or "client_error"),
            record.ttft_s if record.ok else None,
            record.tpot_s,
            record.e2e_s,
            record.itl_s or () if record.ok else (),
            record.lag_s,
            record.prompt_tokens,
            record.completion_tokens,
        )


# ---------------------------------------------------------------- health monitor


HealthReport = Callable[[str, float, float, list[float]], None]


class HealthMonitor:
    """Measures how late a 10 ms sleep wakes up, and CPU time; reports every quarter second.

    `restart()` drops the current window: called right after `gc.collect()`, whose pause is
    ours and deliberate, not a sign of a saturated client.
    """

    def __init__(self, report: HealthReport, on_tick: Callable[[], None] | None = None) -> None:
        self.report = report
        self.on_tick = on_tick
        self.name = process_name()
        self._restart = False

    def restart(self) -> None:
        self._restart = True

    def run(self) -> None:
        """Forever (a greenlet)."""
        window_start, cpu_start = time.perf_counter(), time.process_time()
        lags: list[float] = []
        while True:
            before = time.perf_counter()
            gevent.sleep(LAG_PERIOD_S)
            now = time.perf_counter()
            if self._restart:
                self._restart = False
                window_start, cpu_start, lags = now, time.process_time(), []
                continue
            lags.append(max(now - before - LAG_PERIOD_S, 0.0))
            if now - window_start >= HEALTH_WINDOW_S:
                cpu = time.process_time()
                self.report(self.name, cpu - cpu_start, now - window_start, lags)
                window_start, cpu_start, lags = now, cpu, []
                if self.on_tick is not None:
                    self.on_tick()


def freeze_heap(monitor: HealthMonitor | None = None) -> None:
    """Collect once and move every surviving object out of the collector's way."""
    gc.collect()
    gc.freeze()
    if monitor is not None:
        monitor.restart()


# ---------------------------------------------------------------- the stage controller


class StageController:
    """Runs a plan's stages in order on the local runner or the master."""

    def __init__(
        self,
        environment: Environment,
        plan: LoadPlan,
        book: TicketBook[Any],
        hub: RecordHub,
        stages: JsonlAppender,
        metrics: LoadMetrics,
        expect_workers: int = 0,
    ) -> None:
        self.environment = environment
        self.plan = plan
        self.book = book
        self.hub = hub
        self.stages = stages
        self.metrics = metrics
        self.expect_workers = expect_workers
        self.health = ClientHealth()
        self.abort_reason: str | None = None
        self.monitor: HealthMonitor | None = None
        hub.on_trip = book.cancel_pending

    @property
    def runner(self) -> Any:
        return self.environment.runner

    def add_health(self, process: str, cpu_s: float, wall_s: float, lags: list[float]) -> None:
        """One health window from this process or a worker."""
        self.health.add(process, cpu_s, wall_s, lags)

    def on_health_message(self, environment: Environment, msg: Any, **_: Any) -> None:
        data = msg.data
        self.add_health(str(data["process"]), float(data["cpu_s"]), float(data["wall_s"]), list(data["lags"]))

    def refresh_users_gauge(self) -> None:
        runner = self.runner
        if runner is not None:
            target = self.plan.target
            self.metrics.set_active_users(target.name, target.quant, int(runner.user_count))

    def run(self) -> None:
        """Every stage, then stop the runner. Never raises."""
        try:
            self._wait_for_workers()
            for stage in self.plan.stages:
                if self.abort_reason is not None:
                    self._write(stage, "stage_end", status="aborted", reason=self.abort_reason)
                    continue
                self._run_stage(stage)
        except Exception as error:  # the load must end with its stage lines
            _log.exception("stage controller failed")
            self.abort_reason = f"controller error: {error!r}"
        finally:
            self.book.close()
            self.metrics.set_stage(None)
            gevent.sleep(0.2)
            self.runner.quit()

    def _wait_for_workers(self) -> None:
        if not isinstance(self.runner, MasterRunner):
            return
        deadline = time.monotonic() + WORKERS_TIMEOUT_S
        while self.runner.worker_count < self.expect_workers:
            if time.monotonic() > deadline:
                self.abort_reason = (
                    f"only {self.runner.worker_count} of {self.expect_workers} workers connected"
                )
                return
            gevent.sleep(0.1)

    def _spawn(self, users: int) -> bool:
        runner = self.runner
        runner.start(users, spawn_rate=max(float(users), 1.0) * 50.0)
        deadline = time.monotonic() + SPAWN_TIMEOUT_S
        while runner.user_count != users:
            if time.monotonic() > deadline:
                return False
            gevent.sleep(POLL_S)
        self.refresh_users_gauge()
        return True

    def _announce(self, stage: StagePlan) -> None:
        target = self.plan.target
        labels = (
            target.name,
            target.quant,
            stage.experiment,
            str(stage.users),
            str(stage.repeat),
            "" if stage.rate_rps is None else f"{stage.rate_rps:g}",
        )
        self.metrics.set_stage(labels)
        if isinstance(self.runner, MasterRunner):
            self.runner.send_message(MSG_STAGE, {"labels": list(labels)})
        freeze_heap(self.monitor)

    def _run_phase(self, stage: StagePlan, warmup: bool, start_unix_s: float | None) -> StageTracker:
        tickets = stage_tickets(self.plan, stage, warmup, start_unix_s)
        tracker = StageTracker(stage.stage_id, len(tickets), warmup, self.plan.max_consecutive_errors)
        self.hub.tracker = tracker
        if not tickets:
            return tracker
        handed_before = self.book.handed_out
        self.book.add(tickets)
        deadline = time.monotonic() + stage.timeout_s
        reason = None
        while not tracker.finished:
            if tracker.tripped:
                reason = f"{tracker.consecutive_errors} requests in a row failed (last: {tracker.last_error})"
                break
            if time.monotonic() > deadline:
                reason = (
                    f"stage timeout after {stage.timeout_s:g} s ({tracker.done} of {tracker.planned} done)"
                )
                break
            if isinstance(self.runner, MasterRunner) and self.runner.worker_count == 0:
                reason = "every worker is gone"
                break
            gevent.sleep(POLL_S)
        if reason is not None:
            self.abort_reason = reason
            self.book.cancel_pending()
            grace = time.monotonic() + self.plan.abort_grace_s
            while tracker.done < self.book.handed_out - handed_before and time.monotonic() < grace:
                gevent.sleep(POLL_S)
        elif tracker.ok == 0 and tracker.planned > 0:
            self.abort_reason = f"all {tracker.planned} requests failed (last: {tracker.last_error})"
        return tracker

    def _run_stage(self, stage: StagePlan) -> None:
        if not self._spawn(stage.users):
            self.abort_reason = f"could not start {stage.users} users in {SPAWN_TIMEOUT_S:g} s"
            self._write(stage, "stage_end", status="failed", reason=self.abort_reason)
            return
        self._announce(stage)
        if stage.warmup:
            warm = self._run_phase(stage, True, None)
            if self.abort_reason is not None:
                self.abort_reason = f"warm-up failed: {self.abort_reason}"
                self._write(
                    stage,
                    "stage_end",
                    status="failed",
                    reason=self.abort_reason,
                    done=0,
                    ok=0,
                    warm=warm.done,
                )
                self.metrics.set_stage(None)
                return
            freeze_heap(self.monitor)
        start_unix = time.time() + (0.05 if stage.rate_rps is not None else 0.0)
        self._write(stage, "stage_start", unix_s=time.time())
        self.health = ClientHealth()
        tracker = self._run_phase(stage, False, start_unix)
        status = "ok" if self.abort_reason is None else "failed"
        self._write(
            stage,
            "stage_end",
            status=status,
            reason=self.abort_reason,
            done=tracker.done,
            ok=tracker.ok,
            warm=len(stage.warmup),
            health=True,
        )
        self.metrics.set_stage(None)

    def _write(
        self,
        stage: StagePlan,
        event: str,
        status: str = "ok",
        reason: str | None = None,
        done: int = 0,
        ok: int = 0,
        warm: int = 0,
        health: bool = False,
        unix_s: float | None = None,
    ) -> None:
        plan = self.plan
        runner = self.runner
        workers = int(runner.worker_count) if isinstance(runner, MasterRunner) else 0
        line = plan.stage_event(
            stage,
            event,
            unix_s if unix_s is not None else time.time(),
            requests_done=done,
            requests_ok=ok,
            warmup_requests=warm,
            status=status,
            reason=reason,
            workers=workers,
        )
        if health:
            line.client_cpu_frac = self.health.cpu_frac()
            line.loop_lag_p99_s = self.health.lag_p99_s()
            line.loop_lag_max_s = self.health.lag_max_s()
            line.client_saturated = self.health.saturated(plan.saturation_cpu_frac, plan.saturation_lag_s)
            if line.client_saturated:
                _log.warning(
                    "stage %s: the load generator itself may have been the bottleneck "
                    "(cpu %.2f of a core, loop lag p99 %.1f ms)",
                    stage.stage_id,
                    line.client_cpu_frac or 0.0,
                    (line.loop_lag_p99_s or 0.0) * 1000,
                )
        self.stages.append(line)


# ---------------------------------------------------------------- assembly


@dataclass
class Assembly:
    """The runtime of one process and, where it drives stages, its controller."""

    runtime: LoadRuntime
    controller: StageController | None = None
    hub: RecordHub | None = None


def assemble(
    environment: Environment,
    role: str,
    metrics: LoadMetrics,
    plan: LoadPlan | None = None,
    records_path: Path | None = None,
    stages_path: Path | None = None,
    expect_workers: int = 0,
    tickets: TicketSource | None = None,
) -> Assembly:
    """Wire the runtime for `role` ("local", "master", "worker") on an environment whose runner
    exists. A plan (with records and stages paths) makes local/master drive its stages;
    `tickets` overrides the ticket source (the interactive mode's endless prompts)."""
    runner = environment.runner
    api_key = os.environ.get(API_KEY_ENV) or None
    if role == "worker":
        assert isinstance(runner, WorkerRunner)
        source: TicketSource = tickets or WorkerTickets(runner)
        runtime = LoadRuntime(environment, source, WorkerSink(runner), metrics, api_key)

        def forward(name: str, cpu_s: float, wall_s: float, lags: list[float]) -> None:
            runner.send_message(MSG_HEALTH, {"process": name, "cpu_s": cpu_s, "wall_s": wall_s, "lags": lags})

        monitor = HealthMonitor(forward)

        def on_stage(environment: Environment, msg: Any, **_: Any) -> None:
            freeze_heap(monitor)

        runner.register_message(MSG_STAGE, on_stage)
        gevent.spawn(monitor.run)
        return Assembly(runtime)

    records = JsonlAppender(records_path) if records_path is not None else None
    hub = RecordHub(records)
    controller = None
    if isinstance(runner, MasterRunner):
        master_tickets = MasterTickets(runner)
        runner.register_message(MSG_RECORD, lambda environment, msg, **_: hub.put_line(msg.data["line"]))
        book: TicketBook[Any] = master_tickets.book
        source = tickets or _NoTickets()
    else:
        local = LocalTickets()
        book = local.book
        source = tickets or local
    runtime = LoadRuntime(environment, source, hub, metrics, api_key)
    if plan is not None:
        assert stages_path is not None
        controller = StageController(
            environment, plan, book, hub, JsonlAppender(stages_path), metrics, expect_workers
        )
        if isinstance(runner, MasterRunner):
            # the master sends no requests: only the workers' health matters
            runner.register_message(MSG_HEALTH, controller.on_health_message)
            monitor = HealthMonitor(lambda *_: None, controller.refresh_users_gauge)
        else:
            monitor = HealthMonitor(controller.add_health, controller.refresh_users_gauge)
        controller.monitor = monitor
        gevent.spawn(monitor.run)
    return Assembly(runtime, controller, hub)


class _NoTickets:
    """The master sends no requests itself."""

    def take(self) -> Ticket | None:
        return None
