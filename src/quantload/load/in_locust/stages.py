"""The stage controller: runs a plan's stages in order on the local runner or the master.

For each stage: spawn its users, announce it (metrics, workers), run its warm-up requests, write
`stage_start`, release its measured tickets, wait until every one is recorded (or the circuit
breaker trips, the stage times out, every worker is gone, the load client itself failed), write
`stage_end` with the client's own health. A stage after a failed one is written as aborted
without running. A timed stage (a soak slice, `duration_s`) makes its tickets as it goes
(quantload.load.timed_supply) and ends once those in flight when its time is up are recorded. A
decided stage (`decision`: a sweep level, a limit-search trial) feeds every measured record to its
level's judgement and sends its requests again until the level is decided or its budget is spent
(quantload.load.decided_supply); its end line says what the level's verdict was then.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

import gevent

from quantload.load.client_health import ClientHealth, trust_bounds
from quantload.load.decided_supply import DecidedSupply
from quantload.load.in_locust.health import HealthMonitor, freeze_heap
from quantload.load.in_locust.messages import ClientFailed, HealthWindow, StageStarted
from quantload.load.in_locust.sinks import DriverSink
from quantload.load.level_judgement import LevelJudgement
from quantload.load.metrics import LoadMetrics
from quantload.load.plan import LoadPlan, StagePlan
from quantload.load.processes import WORKERS_MISSING, WORKERS_TIMEOUT_S
from quantload.load.records import JsonlAppender, RecordOutcome
from quantload.load.tickets import StageTracker, TicketBook, stage_tickets
from quantload.load.timed_supply import TimedSupply
from quantload.slo import is_open_loop

if TYPE_CHECKING:  # Locust's own types; the module runs without importing locust
    from locust.env import Environment

POLL_S = 0.02
SPAWN_TIMEOUT_S = 60.0
OPEN_LOOP_START_DELAY_S = 0.05

_log = logging.getLogger(__name__)


class StageController:
    """Runs a plan's stages in order on the local runner or the master."""

    def __init__(
        self,
        environment: Environment,
        plan: LoadPlan,
        book: TicketBook[Any],
        sink: DriverSink,
        stages: JsonlAppender,
        metrics: LoadMetrics,
        expect_workers: int = 0,
        workers_timeout_s: float = WORKERS_TIMEOUT_S,
        master: bool = False,
    ) -> None:
        self.environment = environment
        self.master = master  # a Locust master: its users run on workers, which it waits for
        self.plan = plan
        self.book = book
        self.sink = sink
        self.stages = stages
        self.metrics = metrics
        self.expect_workers = expect_workers
        self.workers_timeout_s = workers_timeout_s
        self.health = ClientHealth()
        self.abort_reason: str | None = None
        self.client_failure: str | None = None
        self.monitor: HealthMonitor | None = None
        self.levels: dict[str, LevelJudgement] = {}  # decided levels by name (quantload.load.plan)
        self._judged: tuple[str, LevelJudgement] | None = None  # the running stage's level
        sink.on_trip = book.cancel_pending
        sink.on_outcome = self._on_outcome

    @property
    def runner(self) -> Any:
        return self.environment.runner

    def add_health(self, window: HealthWindow) -> None:
        """One health window from a process that sends requests (this one or a worker)."""
        self.health.add(window.process, window.cpu_s, window.wall_s, window.lags_s, window.rss_bytes)

    def add_own_cpu(self, window: HealthWindow) -> None:
        """One window of the master itself: its CPU counts in the total, its lateness does not."""
        self.health.add_coordinator(window.process, window.cpu_s, window.wall_s, window.rss_bytes)

    def on_health_message(self, environment: Environment, msg: Any, **_: Any) -> None:
        self.add_health(HealthWindow.from_data(msg.data))

    def client_failed(self, cause: str) -> None:
        """quantload's own code raised while sending or recording: end the running stage now."""
        if self.client_failure is None:
            self.client_failure = cause
            _log.error("load client failed: %s", cause)
        self.book.cancel_pending()

    def on_client_failed_message(self, environment: Environment, msg: Any, **_: Any) -> None:
        failed = ClientFailed.from_data(msg.data)
        self.client_failed(f"{failed.cause} (in {failed.process})")

    def _on_outcome(self, outcome: RecordOutcome) -> None:
        """A record of the running stage: its level's judgement takes it (a decided stage's)."""
        judged = self._judged
        if judged is None or outcome.warmup or outcome.stage_id != judged[0]:
            return
        judged[1].add(
            outcome.ok, outcome.within_deadline, outcome.ttft_s, outcome.ttft_from_intended_s,
            outcome.tpot_s, outcome.e2e_s,
        )  # fmt: skip

    def _level(self, stage: StagePlan) -> LevelJudgement | None:
        decision = stage.decision
        if decision is None:
            return None
        level = self.levels.get(decision.level)
        if level is None:
            level = LevelJudgement(
                decision.slo, stage.users, is_open_loop(stage.arrival, stage.rate_rps), stage.rate_rps,
                decision.max_requests, decision.max_s,
            )  # fmt: skip
            self.levels[decision.level] = level
        return level

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
        if not self.master:
            return
        deadline = time.monotonic() + self.workers_timeout_s
        while self.runner.worker_count < self.expect_workers:
            if time.monotonic() > deadline:
                self.abort_reason = (
                    f"only {self.runner.worker_count} of {self.expect_workers} {WORKERS_MISSING}"
                    f" {self.workers_timeout_s:g} s (load.workers_timeout_s)"
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
        if self.master:
            self.runner.send_message(StageStarted.NAME, StageStarted(labels).to_data())
        freeze_heap(self.monitor)

    def _run_phase(self, stage: StagePlan, warmup: bool, start_unix_s: float | None) -> StageTracker:
        tickets = stage_tickets(self.plan, stage, warmup, start_unix_s)
        timed = stage.duration_s is not None and not warmup and bool(tickets)
        planned = 0 if timed else sum(ticket.record_count for ticket in tickets)
        tracker = StageTracker(
            stage.stage_id, planned, warmup, self.plan.max_consecutive_errors, stage.breaker_ignores
        )
        self.sink.tracker = tracker
        if not tickets:
            return tracker
        handed_before = self.book.handed_records
        supply: TimedSupply | DecidedSupply | None = None
        level = None if warmup else self._level(stage)
        sending_from = time.time()
        if level is not None and stage.decision is not None:
            self._judged = (stage.stage_id, level)
            begins = start_unix_s if start_unix_s is not None else sending_from
            supply = DecidedSupply(
                self.book, tickets, tracker, level, stage.users, begins, stage.decision.min_requests,
                stage.rate_rps if stage.arrival != "closed" else None, self.plan.params.seed + stage.index,
            )  # fmt: skip
            supply.tick(time.time())
        elif timed:  # the soak's slices: the pool's requests again and again until the time is up
            begins = start_unix_s if start_unix_s is not None else time.time()
            supply = TimedSupply(
                self.book, tickets, tracker, stage.users, begins, begins + (stage.duration_s or 0.0),
                stage.rate_rps if stage.arrival != "closed" else None, self.plan.params.seed + stage.index,
            )  # fmt: skip
            supply.tick(time.time())
        else:
            self.book.add(tickets)
        deadline = time.monotonic() + stage.timeout_s
        reason = None
        while not tracker.finished or (supply is not None and supply.running):
            if supply is not None:
                supply.tick(time.time())
            if self.client_failure is not None:
                reason = f"the load client failed: {self.client_failure}"
                break
            if tracker.tripped:
                reason = f"{tracker.consecutive_errors} requests in a row failed (last: {tracker.last_error})"
                break
            if time.monotonic() > deadline:
                reason = (
                    f"stage timeout after {stage.timeout_s:g} s ({tracker.done} of {tracker.planned} done)"
                )
                break
            if self.master and self.runner.worker_count == 0:
                reason = "every worker is gone"
                break
            gevent.sleep(POLL_S)
        if reason is None and self.client_failure is not None:
            reason = f"the load client failed: {self.client_failure}"
        if reason is not None:
            self.abort_reason = reason
            if supply is not None:
                supply.finish()  # make nothing more
            self.book.cancel_pending()
            grace = time.monotonic() + self.plan.abort_grace_s
            while tracker.done < self.book.handed_records - handed_before and time.monotonic() < grace:
                gevent.sleep(POLL_S)
        elif tracker.ok == 0 and tracker.planned > 0:
            self.abort_reason = f"all {tracker.planned} requests failed (last: {tracker.last_error})"
        if level is not None:
            level.spent_s += time.time() - sending_from
            self._judged = None
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
        if stage.duration_s is not None:
            # Locust's own counters keep an entry per second for as long as they run: a soak's
            # slices restart them, so the load client's memory does not grow with the soak's length
            self.environment.stats.reset_all()
        start_unix = time.time() + (OPEN_LOOP_START_DELAY_S if stage.rate_rps is not None else 0.0)
        self._write(stage, "stage_start", unix_s=time.time())
        self.health = ClientHealth()
        tracker = self._run_phase(stage, False, start_unix)
        status = "ok" if self.abort_reason is None else "failed"
        level = self.levels.get(stage.decision.level) if stage.decision is not None else None
        self._write(
            stage,
            "stage_end",
            status=status,
            reason=self.abort_reason,
            done=tracker.done,
            ok=tracker.ok,
            warm=len(stage.warmup),
            health=True,
            planned=tracker.planned if stage.duration_s is not None or level is not None else None,
            level=level,
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
        planned: int | None = None,
        level: LevelJudgement | None = None,
    ) -> None:
        plan = self.plan
        runner = self.runner
        workers = int(runner.worker_count) if self.master else 0
        counted: dict[str, Any] = {} if planned is None else {"requests_planned": planned}  # as sent
        if level is not None:
            counted.update(level_outcome=level.outcome, level_requests=level.requests)
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
            **counted,
        )
        if health:
            line.client_cpu_frac = self.health.cpu_frac()
            line.client_cpu_total_frac = self.health.cpu_total_frac()
            line.loop_lag_p99_s = self.health.lag_p99_s()
            line.loop_lag_max_s = self.health.lag_max_s()
            line.client_rss_bytes = self.health.resident_bytes()
            line.client_error_s = plan.trust_error_s
            line.client_saturated = self.health.saturated(plan.saturation_cpu_frac, plan.saturation_lag_s)
            senders = max(workers, 1) if self.master else 1
            trust = self.health.trust(trust_bounds(plan), stage.users / senders)
            if trust is not None:
                line.client_trust, line.client_trust_why = trust.level, trust.why
            if line.client_saturated:
                _log.warning(
                    "stage %s: the load generator itself may have been the bottleneck "
                    "(cpu %.2f of a core, loop lag p99 %.1f ms)",
                    stage.stage_id,
                    line.client_cpu_frac or 0.0,
                    (line.loop_lag_p99_s or 0.0) * 1000,
                )
            elif trust is not None and trust.level == "degraded":
                _log.warning("stage %s: its figures may be worse than stated: %s", stage.stage_id, trust.why)
        self.stages.append(line)
