"""Put one Locust process's parts together for its role.

Roles
- local: one process; the controller, the ticket book and the users live together.
- master: runs the controller and the ticket book, writes records.jsonl and stages.jsonl; sends
  no requests. Workers ask it for tickets, send it every record and a health window four times a
  second (`quantload.load.in_locust.messages`). Locust merges the workers' request statistics
  (the TTFT/TPOT rows included) on its own.
- worker: runs users; sends every record to the master; serves its own /metrics.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import gevent
from locust.env import Environment
from locust.runners import MasterRunner, WorkerRunner

from quantload.load.in_locust.health import HealthMonitor, freeze_heap
from quantload.load.in_locust.messages import ClientFailed, HealthWindow, RecordLine, StageStarted
from quantload.load.in_locust.runtime import LoadRuntime, process_name
from quantload.load.in_locust.sinks import DriverSink, WorkerSink
from quantload.load.in_locust.stages import StageController
from quantload.load.in_locust.ticket_sources import (
    LocalTickets,
    MasterTickets,
    NoTickets,
    TicketSource,
    WorkerTickets,
)
from quantload.load.metrics import LoadMetrics
from quantload.load.plan import API_KEY_ENV, LoadPlan
from quantload.load.processes import WORKERS_TIMEOUT_S
from quantload.load.records import JsonlAppender
from quantload.load.tickets import TicketBook

Role = Literal["local", "master", "worker"]


@dataclass
class ProcessParts:
    """What one Locust process runs: the runtime its users share and, where the process drives
    the stages of a plan (local, master), the stage controller and the sink that writes records."""

    runtime: LoadRuntime
    controller: StageController | None = None
    sink: DriverSink | None = None


def wire_process(
    environment: Environment,
    role: Role,
    metrics: LoadMetrics,
    plan: LoadPlan | None = None,
    records_path: Path | None = None,
    stages_path: Path | None = None,
    expect_workers: int = 0,
    tickets: TicketSource | None = None,
    workers_timeout_s: float = WORKERS_TIMEOUT_S,
) -> ProcessParts:
    """The parts for `role` on an environment whose runner exists.

    A plan (with records and stages paths) makes local/master drive its stages; `tickets`
    replaces the ticket source (the interactive mode's endless prompts). The API key comes from
    the QL_TARGET_API_KEY environment variable, never from the plan.
    """
    runner = environment.runner
    api_key = os.environ.get(API_KEY_ENV) or None
    if role == "worker":
        assert isinstance(runner, WorkerRunner)
        return _worker_parts(environment, runner, metrics, api_key, tickets)
    records = JsonlAppender(records_path) if records_path is not None else None
    sink = DriverSink(records)
    book: TicketBook[Any]
    if isinstance(runner, MasterRunner):
        master_tickets = MasterTickets(runner)
        runner.register_message(
            RecordLine.NAME, lambda environment, msg, **_: sink.put_line(RecordLine.from_data(msg.data).line)
        )
        book = master_tickets.book
        source: TicketSource = tickets or NoTickets()
    else:
        local = LocalTickets()
        book = local.book
        source = tickets or local
    runtime = LoadRuntime(environment, source, sink, metrics, api_key)
    controller = None
    if plan is not None:
        assert stages_path is not None
        controller = StageController(
            environment, plan, book, sink, JsonlAppender(stages_path), metrics, expect_workers,
            workers_timeout_s, master=isinstance(runner, MasterRunner),
        )
        runtime.on_fatal = controller.client_failed
        if isinstance(runner, MasterRunner):
            runner.register_message(ClientFailed.NAME, controller.on_client_failed_message)
            # the master sends no requests: its own CPU counts in the total, its lateness does not
            runner.register_message(HealthWindow.NAME, controller.on_health_message)
            monitor = HealthMonitor(controller.add_own_cpu, controller.refresh_users_gauge)
        else:
            monitor = HealthMonitor(controller.add_health, controller.refresh_users_gauge)
        controller.monitor = monitor
        gevent.spawn(monitor.run)
    return ProcessParts(runtime, controller, sink)


def _worker_parts(
    environment: Environment,
    runner: WorkerRunner,
    metrics: LoadMetrics,
    api_key: str | None,
    tickets: TicketSource | None,
) -> ProcessParts:
    source: TicketSource = tickets or WorkerTickets(runner)
    runtime = LoadRuntime(environment, source, WorkerSink(runner), metrics, api_key)
    name = process_name()

    def report_failure(cause: str) -> None:
        runner.send_message(ClientFailed.NAME, ClientFailed(name, cause).to_data())

    runtime.on_fatal = report_failure

    def forward(window: HealthWindow) -> None:
        runner.send_message(HealthWindow.NAME, window.to_data())

    monitor = HealthMonitor(forward)

    def on_stage(environment: Environment, msg: Any, **_: Any) -> None:
        freeze_heap(monitor)

    runner.register_message(StageStarted.NAME, on_stage)
    gevent.spawn(monitor.run)
    return ProcessParts(runtime)
