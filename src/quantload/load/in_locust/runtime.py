"""The part of a Locust process every user shares: connection pools, sending, recording.

A user takes a ticket, waits until it is due (open loop: the Poisson schedule; closed loop: a
random offset before its first request of a stage, so users do not start in lockstep), sends it
with `stream_request` (which only stamps each event's arrival) and goes straight back for the
next ticket. One recorder greenlet per process, running when the event loop is idle, then works
out what the events said, builds the record, hands it to the sink and (except for warm-ups)
fires three Locust request events, the request itself, "TTFT" and "TPOT", and updates the
Prometheus metrics. Transport failures skip the queue, so the circuit breaker sees them at once.

An exception raised by quantload's own code while sending or recording (a bug, never a server
fault: those are error classes) is a `client_error` record and is reported through `on_fatal`,
which ends the running stage at once with that cause (`StageController.client_failed`, reached
by message from a worker); no ticket is ever lost silently, so no stage waits out its timeout.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import gevent
from gevent.event import Event

from quantload.errors import QuantloadError
from quantload.load.client import ConnectionPool, Endpoint, stream_request
from quantload.load.history_trim import HistoryTrimmer, history_budget_tokens
from quantload.load.in_locust.sinks import RecordSink
from quantload.load.in_locust.ticket_sources import TicketSource
from quantload.load.measure import aborted_record, build_record, cut_turn_records
from quantload.load.metrics import LoadMetrics
from quantload.load.openai_chunks import answer_text, classify_stream
from quantload.load.records import RequestRecord
from quantload.load.stream_result import StreamResult
from quantload.load.synthetic import ServerTokenizer
from quantload.load.tickets import StageContext, Ticket

if TYPE_CHECKING:  # Locust's own types; the module runs without importing locust
    from locust.env import Environment

RECORD_WAIT_MAX_S = 0.05
REQUEST_TYPE = "POST"
LLM_TYPE = "LLM"

_log = logging.getLogger(__name__)


def process_name() -> str:
    """Who sends: "<host>:<pid>"."""
    return f"{socket.gethostname()}:{os.getpid()}"


class LoadRequestError(Exception):
    """A failed request, as Locust's statistics show it: "<error_class>: <message>"."""


@dataclass
class UserState:
    """Per-user memory: the last stage it sent in (for the first-request offset), its dice, and
    the lane of the ticket it is sending (a tenant's: it is given back when the user asks again)."""

    stage_id: str | None = None
    rng: random.Random = field(default_factory=random.Random)
    holding: str | None = None


_PoolKey = tuple[str, str, float, str, float]
_Finished = tuple[Ticket, StreamResult, float, str]
FatalReport = Callable[[str], None]


def _log_fatal(cause: str) -> None:
    _log.error("load client failed: %s", cause)


def error_text(error: BaseException) -> str:
    """An exception as one short line: its type and first line."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:240]}" if lines else type(error).__name__


class LoadRuntime:
    """Everything users of one Locust process share."""

    def __init__(
        self,
        environment: Environment,
        tickets: TicketSource,
        sink: RecordSink,
        metrics: LoadMetrics,
        api_key: str | None,
        on_fatal: FatalReport = _log_fatal,
    ) -> None:
        self.environment = environment
        self.tickets = tickets
        self.sink = sink
        self.metrics = metrics
        self.api_key = api_key
        self.on_fatal = on_fatal
        self.worker = process_name()
        self._pools: dict[_PoolKey, tuple[Endpoint, ConnectionPool]] = {}
        self._trimmers: dict[str, HistoryTrimmer] = {}
        self._finished: deque[_Finished] = deque()
        self._wake = Event()
        self._recorder = gevent.spawn(self._record_loop)

    def take(self, state: UserState | None = None) -> Ticket | None:
        """The next ticket for a user (blocks); None when there will be no more. With the user's
        state, the ticket it held is given back first (its tenant may send another)."""
        done = state.holding if state is not None else None
        if state is not None:
            state.holding = None
        ticket = self.tickets.take(done)
        if state is not None and ticket is not None:
            state.holding = ticket.lane
        return ticket

    def _pool(self, stage: StageContext) -> tuple[Endpoint, ConnectionPool]:
        key = (
            stage.url,
            stage.path,
            stage.connect_timeout_s,
            stage.reuse_connections,
            stage.first_byte_timeout_s,
        )
        found = self._pools.get(key)
        if found is None:
            endpoint = Endpoint.from_url(stage.url, stage.path, self.api_key)
            reuse = stage.reuse_connections if stage.reuse_connections in ("always", "never") else "auto"
            pool = ConnectionPool(
                endpoint,
                stage.connect_timeout_s,
                reuse,  # type: ignore[arg-type]
                first_byte_timeout_s=stage.first_byte_timeout_s,
            )
            found = self._pools[key] = (endpoint, pool)
        return found

    def execute(self, ticket: Ticket, state: UserState) -> None:
        """Send one ticket when it is due, then queue what happened for the recorder.

        Building the record, writing it and reporting it to Locust and Prometheus happen in one
        recorder greenlet, off the user's path: the user is back for its next ticket at once,
        which keeps the delivered concurrency at the asked one when there are hundreds of users.
        Failed requests are recorded at once instead, so the circuit breaker sees them in time.
        Never raises, except to let the user's greenlet be killed.

        A conversation's ticket is sent turn after turn by this user: after each reply it waits the
        next turn's think time and sends the whole history with the server's actual reply (where
        the stage trims histories, the part of it that fits: quantload.load.history_trim). A turn
        that fails ends the conversation; its later turns are recorded as `session_cut`.
        """
        try:
            self._execute(ticket, state)
        except gevent.GreenletExit:
            raise
        except Exception as error:  # our own bug: one client_error record, and the stage ends
            _log.exception("the load client failed on a request")
            cause = error_text(error)
            self._client_failed(ticket, cause)

    def _client_failed(self, ticket: Ticket, cause: str) -> None:
        """Record `ticket` as a client_error (best effort) and report the cause as fatal."""
        try:
            now = time.time()
            result = StreamResult(sent_unix_s=now, error_class="client_error", error=cause, end_s=0.0)
            result.classified = True
            self.sink.put(build_record(ticket, result, 0.0, self.worker))
        except Exception:
            _log.exception("could not record the failed request either")
        self.on_fatal(cause)

    def _execute(self, ticket: Ticket, state: UserState) -> None:
        current = ticket
        while True:
            result, lag_s = self._send(current, state)
            if not current.later_turns:
                self._finish(current, result, lag_s)
                return
            reply = answer_text(payload for _, payload in result.events)
            classify_stream(result)  # whether the conversation goes on depends on the verdict
            self._finish(current, result, lag_s)
            if not result.ok:
                why = f"turn {current.turn} failed ({result.error_class})"
                for record in cut_turn_records(current, self.worker, time.time(), why):
                    self.sink.put(record)
                return
            think_s = current.later_turns[0].think_s
            if think_s > 0:
                gevent.sleep(think_s)
            if current.stage.context_policy != "trim":
                current = current.next_turn(reply)
                continue
            trimmed = self._trimmed_turn(current, reply, result)
            if isinstance(trimmed, StreamResult):  # the history could not be counted
                turn = current.next_turn(reply)
                self._finish(turn, trimmed, 0.0)
                why = f"turn {turn.turn} failed ({trimmed.error_class})"
                for record in cut_turn_records(turn, self.worker, time.time(), why):
                    self.sink.put(record)
                return
            current = trimmed

    def _trimmed_turn(self, current: Ticket, reply: str, result: StreamResult) -> Ticket | StreamResult:
        """The next turn with its history trimmed to the slot, or the failure of counting it."""
        stage = current.stage
        trimmer = self._trimmers.get(stage.url)
        if trimmer is None:
            trimmer = self._trimmers[stage.url] = HistoryTrimmer(ServerTokenizer(stage.url, self.api_key))
        usage = result.usage or {}
        completion = usage.get("completion_tokens")
        try:
            turn = trimmer.next_turn(current, reply, completion if isinstance(completion, int) else None)
            if stage.slot_context_tokens is None:
                return turn
            budget = history_budget_tokens(stage.slot_context_tokens, turn.asked_max_tokens)
            return trimmer.fit(turn, budget).ticket
        except QuantloadError as error:
            failed = StreamResult(
                sent_unix_s=time.time(),
                sent_perf_s=time.perf_counter(),
                end_s=0.0,
                error_class="connect_error",
                error=f"the history trim could not count tokens: {error.one_line()}",
            )
            failed.classified = True
            return failed

    def _send(self, ticket: Ticket, state: UserState) -> tuple[StreamResult, float]:
        """Wait until `ticket` is due, stream it; what the client saw and the schedule lag."""
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
        except Exception as error:  # a bug must cost one record and end the stage, not hang it
            _log.exception("request failed inside the client")
            result = StreamResult(error_class="client_error", error=error_text(error))
            self.on_fatal(error_text(error))
        finally:
            deadline.cancel()
        if not result.sent_unix_s:
            result.sent_unix_s, result.sent_perf_s = called_unix, called
        return result, result.sent_perf_s - intended

    def _finish(self, ticket: Ticket, result: StreamResult, lag_s: float) -> None:
        route = ticket.stage.path
        if not result.ok:  # transport failures are recorded at once: the breaker must see them
            if not result.classified or result.end_s is None:  # a turn's verdict keeps its stream end
                result.end_s = time.perf_counter() - result.sent_perf_s
            self._record(ticket, result, lag_s, route)
            return
        self._finished.append((ticket, result, lag_s, route))
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
        except Exception as error:  # one broken record must not stop the recorder, nor go unseen
            _log.exception("could not record a finished request")
            self.on_fatal(f"could not record a finished request: {error_text(error)}")

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
            (record.server, record.quant, record.experiment, record.tenant or ""),
            "ok" if record.ok else (record.error_class or "client_error"),
            record.ttft_s if record.ok else None,
            record.tpot_s,
            record.e2e_s,
            record.itl_s or () if record.ok else (),
            record.lag_s,
            record.prompt_tokens,
            record.completion_tokens,
        )
