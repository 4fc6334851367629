"""Run one plan in Locust processes of its own, watch them, and summarize its stages.

`run_plan(plan, context)` writes the plan to `<run_dir>/load-plans/<invocation>.json`, starts the
processes of its layout (`quantload.load.processes`: one local process, or a master and workers,
here or on other hosts), which append to `<run_dir>/records.jsonl` and `<run_dir>/stages.jsonl`,
and follows both files' new lines as they come: each stage's measured records feed its figures
(quantload.load.summary), and when the stage's end line appears its summary is appended to
`summaries.jsonl` at once (and the stage's figures are let go). It returns the summaries and the
stage lines it read, so no caller reads a file again. Locust never runs in the caller's process:
`import locust` monkey-patches the interpreter.

Robust by construction: the target URL is checked before any process starts; the whole
invocation is bounded in time; if any process fails (exits with an error: the driver, or a worker
while the driver runs) or the driver overruns, every process is stopped, the plan's unfinished
stages are written as aborted, and a failure raises `LoadError` with the cause the process printed
(`FAILURE_MARKER`) or the last line of its log, so the console says why at once. Every request
has a deadline and every stage a time bound and a circuit breaker (inside the Locust process), so
a dead target costs at most a few failed requests, never a hang. A /metrics port that another
process holds costs one warning line (this load's series would be missing from Prometheus).

Progress: `progress(done, total, note)` with measured requests done out of planned, read twice a
second from those new lines; a plan whose stages are decided as they go (their requests are
planned, then sent again until their level is decided) has no total: its note names the stage.

Grafana: given `observe=` settings with a `grafana_url`, the plan's stages are pushed as
annotations once they have all ended (quantload.observe.annotations); a Grafana that does not
answer costs one warning line, never the load.
"""

from __future__ import annotations

__all__ = ["LoadError", "PlanOutcome", "run_plan"]

import contextlib
import functools
import logging
import os
import re
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, TypeVar
from urllib.parse import urlsplit

from quantload import machine_share
from quantload.childproc import start_child, stop_group
from quantload.config import LoadSettings, ObserveSettings
from quantload.errors import QuantloadError
from quantload.load.calibration_file import machine_limits
from quantload.load.client import Endpoint, EndpointError
from quantload.load.level_judgement import level_block_requests
from quantload.load.plan import API_KEY_ENV, LoadPlan, StagePlan
from quantload.load.processes import (
    FAILURE_MARKER,
    LoadProcess,
    LocustProcesses,
    ProcessLayout,
    choose_workers,
    usable_cores,
)
from quantload.load.records import JsonlAppender, RequestRecord, StageEvent
from quantload.load.summary import StageFigures, StageSummary, summarize
from quantload.rundir import write_json_atomic
from quantload.rundir.handle import RunDir
from quantload.slo import Slo, is_open_loop
from quantload.urls import EXAMPLE

if TYPE_CHECKING:
    from quantload.run_context import RunContext

POLL_S = 0.5
STARTUP_ALLOWANCE_S = 120.0
STOP_GRACE_S = 10.0
LOG_TAIL_BYTES = 64 * 1024

_log = logging.getLogger(__name__)


class LoadError(QuantloadError):
    """The load generator could not run (not: the target failed requests)."""


def default_layout(plan: LoadPlan, settings: LoadSettings, metrics_port: int) -> LocustProcesses:
    """The Locust processes `settings` ask for, the worker count chosen for this machine (over the
    streams one process measured right here, when the plan knows them), the driver's /metrics on
    `metrics_port`.

    The warning of a count the machine cannot run is the caller's to show (the CLI prints it
    once per command, before any load starts).
    """
    max_users = max((stage.users for stage in plan.stages), default=1)
    per_process = plan.calibrated_streams_per_process
    choice = choose_workers(settings.workers, max_users, usable_cores(), per_process)
    return LocustProcesses(
        choice.workers, settings.metrics_host, metrics_port,
        remote_workers=settings.remote_workers, master_host=settings.master_host,
        master_port=settings.master_port, workers_timeout_s=settings.workers_timeout_s,
    )  # fmt: skip


def held_to_this_machine(plan: LoadPlan, context: RunContext) -> LoadPlan:
    """The plan with what its client is held to on this machine: the error its figures are stated
    within and the streams one process measured right (its latest `quantload calibrate`)."""
    limits = machine_limits(context.settings, context.cwd)
    return plan.model_copy(
        update={
            "trust_error_s": limits.error_s,
            "trust_lag_s": limits.lag_s,
            "calibrated_streams_per_process": limits.streams_per_process,
        }
    )


class NewLines:
    """The complete lines a growing file gained since the last call."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.offset = path.stat().st_size if path.is_file() else 0
        self._partial = ""

    def lines(self) -> list[str]:
        if not self.path.is_file():
            return []
        with self.path.open(encoding="utf-8") as handle:
            handle.seek(self.offset)
            chunk = handle.read()
            self.offset = handle.tell()
        parts = (self._partial + chunk).split("\n")
        self._partial = parts.pop()
        return parts


_Line = TypeVar("_Line", RequestRecord, StageEvent)


def _parsed(lines: Sequence[str], kind: type[_Line], head: str) -> Iterator[_Line]:
    """The lines of stages whose id starts with `head`, parsed (a cheap text test first, which
    any writer's JSON spacing passes)."""
    marker = re.compile(r'"stage_id"\s*:\s*"' + re.escape(head))
    for line in lines:
        if marker.search(line):
            try:
                yield kind.from_json_line(line)
            except ValueError:  # a torn line, or one from an older or foreign writer
                continue


@dataclass
class PlanOutcome:
    """What a plan's run produced: one summary per stage that ended, and every stage line read."""

    summaries: list[StageSummary]
    events: list[StageEvent]

    @property
    def busy_s(self) -> float:
        """Wall time spent inside the stages (from their start to their end lines)."""
        return sum(
            (s.ended_unix_s - s.started_unix_s)
            for s in self.summaries
            if s.started_unix_s is not None and s.ended_unix_s is not None
        )


def _local_server(url: str) -> set[int]:
    """The processes serving `url` when it is on this machine's loopback (none otherwise)."""
    try:
        parsed = urlsplit(url)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
    except ValueError:
        return set()
    if parsed.hostname not in ("127.0.0.1", "localhost", "::1"):
        return set()
    return machine_share.listening_pids(port)


def _figures(stage: StagePlan, slo: Slo, margin_s: float) -> StageFigures:
    open_loop = is_open_loop(stage.arrival, stage.rate_rps)
    judged = stage.decision.slo if stage.decision is not None else slo
    return StageFigures(judged, open_loop, level_block_requests(judged, stage.users, open_loop), margin_s)


class InvocationWatch:
    """One invocation's new lines: its measured records feed each stage's figures; each stage's
    end line turns them into its summary, appended to summaries.jsonl at once."""

    def __init__(
        self, plan: LoadPlan, run_dir: RunDir, slo: Slo, interference_cpu_frac: float = 0.25
    ) -> None:
        self.plan = plan
        self.interference_cpu_frac = interference_cpu_frac
        self.run_dir = run_dir
        self.slo = slo
        self.head = f"{plan.invocation}-"
        self.records = NewLines(run_dir.records_path)
        self.stages = NewLines(run_dir.stages_path)
        self.figures: dict[str, StageFigures] = {
            stage.stage_id: _figures(stage, slo, plan.trust_error_s) for stage in plan.stages
        }
        self.starts: dict[str, StageEvent] = {}
        self.cpu: dict[str, machine_share.CpuSample] = {}  # each running stage's CPU clocks at its start
        self.server_pids = _local_server(plan.target.url)
        self.server_cpus = machine_share.server_cores(self.server_pids)
        self.events: list[StageEvent] = []
        self.summaries: dict[str, StageSummary] = {}
        self.done = 0
        self.note = "starting"

    def poll(self) -> None:
        """Read what was appended since the last poll.

        The stage lines are read before the records: the driver appends a stage's records before
        its end line, so every record of a stage whose end line is read is read too, and its
        summary counts them all (read the other way round, records appended between the two
        reads were left out of their stage's summary).
        """
        stage_lines = self.stages.lines()
        for record in _parsed(self.records.lines(), RequestRecord, self.head):
            figures = self.figures.get(record.stage_id or "")
            if figures is not None and not record.warmup:
                figures.add_record(record)
                self.done += 1
        for event in _parsed(stage_lines, StageEvent, self.head):
            self.events.append(event)
            if event.event == "stage_start":
                self.starts[event.stage_id] = event
                self.cpu[event.stage_id] = machine_share.sample(self.server_pids, self.server_cpus)
                self.note = (
                    f"{self.plan.target.name} {event.experiment}"
                    f" stage {event.stage_index + 1}/{len(self.plan.stages)}"
                )
            elif event.stage_id in self.figures and event.stage_id not in self.summaries:
                # a finished stage's figures are let go: a soak of many slices holds one at a time
                figures = self.figures.pop(event.stage_id)
                summary = summarize(event, figures, self.starts.pop(event.stage_id, None))
                started = self.cpu.pop(event.stage_id, None)
                if started is not None:
                    ended = machine_share.sample(self.server_pids, self.server_cpus)
                    found = machine_share.between(started, ended)
                    if found is not None:
                        summary = summary.model_copy(
                            update={
                                "other_cpu_frac": found.other_cpu_frac,
                                "machine_busy": found.reason(self.interference_cpu_frac),
                            }
                        )
                self.summaries[event.stage_id] = summary
                self.run_dir.append_summary(summary)

    def close_stages(self, reason: str) -> None:
        """An aborted end line (and its summary) for every stage of the plan that has none."""
        self.poll()
        missing = [stage for stage in self.plan.stages if stage.stage_id not in self.summaries]
        if not missing:
            return
        appender = JsonlAppender(self.run_dir.stages_path)
        try:
            for stage in missing:
                appender.append(
                    self.plan.stage_event(stage, "stage_end", time.time(), status="aborted", reason=reason)
                )
        finally:
            appender.close()
        self.poll()

    def outcome(self) -> PlanOutcome:
        ordered = [self.summaries[s.stage_id] for s in self.plan.stages if s.stage_id in self.summaries]
        return PlanOutcome(ordered, list(self.events))


def _stop(processes: Sequence[subprocess.Popen[bytes]]) -> None:
    """Every load process and what it started: all signalled at once, each waited for in turn
    (within STOP_GRACE_S, then killed)."""
    for process in processes:
        if process.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
    for process in processes:
        stop_group(process, STOP_GRACE_S)


@dataclass(frozen=True)
class _Started:
    """A started load process, its spec and its log."""

    spec: LoadProcess
    process: subprocess.Popen[bytes]
    log_path: Path


def _keep_started(
    started: list[_Started], spec: LoadProcess, log_path: Path, process: subprocess.Popen[bytes]
) -> None:
    started.append(_Started(spec, process, log_path))


def failure_cause(log_path: Path, returncode: int) -> str:
    """Why a load process failed: what follows its last FAILURE_MARKER line, else its log's last
    line (a traceback ends with the exception), else its exit code."""
    try:
        with log_path.open("rb") as handle:
            handle.seek(max(log_path.stat().st_size - LOG_TAIL_BYTES, 0))
            tail = handle.read().decode("utf-8", "replace")
    except OSError:
        tail = ""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    marked = [line for line in lines if FAILURE_MARKER in line]
    if marked:
        return marked[-1].split(FAILURE_MARKER, 1)[1]
    if lines:
        return f"{lines[-1][:300]} (exit code {returncode})"
    return f"exit code {returncode}"


def _failed(started: Sequence[_Started]) -> _Started | None:
    """The driver if it exited with an error, else a worker that did while the driver runs."""
    driver = started[0]
    code = driver.process.poll()
    if code is not None:
        return driver if code != 0 else None
    for other in started[1:]:
        code = other.process.poll()
        if code is not None and code != 0:
            return other
    return None


def check_target(plan: LoadPlan) -> None:
    """LoadError when the plan's target URL is not one the load client can talk to."""
    try:
        Endpoint.from_url(plan.target.url, plan.params.path)
    except EndpointError as error:
        hint = f"give its base URL, e.g. {EXAMPLE}"
        raise LoadError(f"load target {plan.target.name}: {error}", hint) from None


def warn_taken_metrics_ports(specs: Sequence[LoadProcess]) -> list[str]:
    """One warning line per load process whose /metrics address another process already holds."""
    warnings = []
    for spec in specs:
        if not spec.metrics_port:
            continue
        try:
            with socket.socket(socket.AF_INET6 if ":" in spec.metrics_host else socket.AF_INET) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind((spec.metrics_host, spec.metrics_port))
        except OSError as error:
            warnings.append(
                f"load /metrics on {spec.metrics_host}:{spec.metrics_port} ({spec.role}) cannot be"
                f" served ({error.strerror or error}): Prometheus will miss this load's series"
                " (set load.metrics_port to a free port, or 0 for none)"
            )
    for line in warnings:
        _log.warning("warning: %s", line)
    return warnings


def _time_bound_s(plan: LoadPlan) -> float:
    per_stage = sum(2 * stage.timeout_s + plan.abort_grace_s + 60.0 for stage in plan.stages)
    return STARTUP_ALLOWANCE_S + per_stage


def run_plan(plan: LoadPlan, context: RunContext, *, layout: ProcessLayout | None = None) -> PlanOutcome:
    """Run a plan and summarize its stages (see the module docstring).

    The target's API key (`plan.target`) reaches the Locust processes through their environment
    only. `layout` replaces the Locust processes the settings ask for (tests run a stand-in
    process through it).
    """
    check_target(plan)
    plan = held_to_this_machine(plan, context)
    settings, run_dir, progress = context.settings.load, context.run_dir, context.progress
    run_dir.path.mkdir(parents=True, exist_ok=True)
    plan_path = run_dir.plan_path(plan.invocation)
    write_json_atomic(plan_path, plan.model_dump(mode="json"))
    logs = run_dir.logs
    env = {k: v for k, v in (context.environ or os.environ).items() if k != API_KEY_ENV}
    env["PYTHONUNBUFFERED"] = "1"
    api_key = plan.target.api_key_text
    if api_key:
        env[API_KEY_ENV] = api_key
    chosen = layout if layout is not None else default_layout(plan, settings, context.metrics_port)
    watch = InvocationWatch(plan, run_dir, context.slo, settings.interference_cpu_frac)
    total = None if any(stage.decision is not None for stage in plan.stages) else plan.total_requests
    started: list[_Started] = []
    handles: list[IO[bytes]] = []
    exit_note = ""
    failure: LoadError | None = None
    specs = chosen.processes(plan_path, run_dir.path, plan.invocation)
    warn_taken_metrics_ports(specs)
    try:
        for spec in specs:
            log_path = logs / spec.log_name
            handle: IO[bytes] = log_path.open("ab")
            handles.append(handle)
            try:
                start_child(
                    spec.argv,
                    functools.partial(_keep_started, started, spec, log_path),
                    stdout=handle,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=env,
                )
            except OSError as error:
                raise LoadError(f"cannot start the load process: {error}") from None
        driver = started[0].process
        progress(0, total, watch.note)
        deadline = time.monotonic() + _time_bound_s(plan)
        while True:
            failed = _failed(started)
            if failed is not None:
                code = failed.process.returncode
                cause = failure_cause(failed.log_path, code)
                exit_note = f"load process failed: {cause}"
                failure = LoadError(
                    f"the load process ({failed.spec.role}) failed: {cause}", f"its log: {failed.log_path}"
                )
                break
            if driver.poll() is not None:
                break
            if time.monotonic() > deadline:
                exit_note = "load process overran its time bound and was killed"
                break
            watch.poll()
            progress(watch.done, total, watch.note)
            time.sleep(POLL_S)
    except KeyboardInterrupt:
        exit_note = "interrupted (Ctrl-C, SIGTERM or SIGHUP)"
        raise
    finally:
        _stop([s.process for s in started])
        for handle in handles:
            handle.close()
        # every stage of the plan ends with a line (and a summary), even when the load was interrupted
        watch.close_stages(exit_note or "load process ended before this stage")
    if failure is not None:
        raise failure
    outcome = watch.outcome()
    done = sum(s.requests for s in outcome.summaries)
    observe = context.settings.observe
    if observe.grafana_url:
        progress(done, total, "annotating stages in Grafana")
        _push_annotations(plan, run_dir, observe)
    progress(done, total, "done")
    return outcome


def _push_annotations(plan: LoadPlan, run_dir: RunDir, observe: ObserveSettings) -> int:
    """This invocation's stages as Grafana annotations; 0 when Grafana is unset or unreachable."""
    # Imported here: grafana-client costs ~0.4 s at import, which no run without Grafana should pay.
    from quantload.observe.annotations import push_invocation_annotations

    return push_invocation_annotations(run_dir.stages_path, observe, plan.invocation)
