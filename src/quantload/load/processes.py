"""Which Locust processes run a plan, and how many workers this machine can usefully run.

One process (role "local") drives the stages and sends the requests. With N workers a master
drives the stages and writes the files, and N workers send the requests; that only pays off when
one process cannot keep up (hundreds of streams) and every process gets a core of its own.
Measured on 2 cores with the fake server: 256 streams, TTFT error p99 12 ms in one process,
114 ms with a master and 2 workers, which queued for the CPU with the server.

`choose_workers` turns `load.workers` ("auto" or a number) into a count for this machine:
"auto" runs one process unless the plan has more than STREAMS_PER_PROCESS concurrent users and
there are cores for at least two workers besides the master's; a number is used as given, with a
warning when the master and that many workers cannot each have a core.
"""

from __future__ import annotations

import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

from quantload.config import LoadSettings
from quantload.llamacpp.server import free_port

Role = Literal["local", "master", "worker"]
WorkersSetting = int | Literal["auto"]
STREAMS_PER_PROCESS = 256  # one process measured these within 5 ms here (quantload calibrate)
ENTRY_MODULE = "quantload.load.in_locust.process"


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity), at least 1."""
    try:
        return max(len(os.sched_getaffinity(0)), 1)
    except (AttributeError, OSError):  # not on Linux
        return max(os.cpu_count() or 1, 1)


@dataclass(frozen=True)
class WorkerChoice:
    """How many Locust workers to run (0 = one process), why, and a warning if it will hurt."""

    workers: int
    reason: str
    warning: str | None = None


def choose_workers(requested: WorkersSetting, max_users: int, cores: int) -> WorkerChoice:
    """The worker count for a plan whose largest stage has `max_users` users, on `cores` cores."""
    room = max(cores - 1, 0)  # each worker needs a core; the master and the rest of the machine one
    if requested == "auto":
        if max_users <= STREAMS_PER_PROCESS:
            return WorkerChoice(0, f"one process: {max_users} users fit in one (up to {STREAMS_PER_PROCESS})")
        wanted = math.ceil(max_users / STREAMS_PER_PROCESS)
        if room < 2:
            return WorkerChoice(
                0, f"one process: {cores} core(s) leave no room for a master and two workers"
            )
        count = min(wanted, room)
        return WorkerChoice(count, f"{count} workers: {max_users} users, {cores} cores")
    if requested < 0:
        raise ValueError(f"workers must be 0 or more, got {requested}")
    if requested > room:
        return WorkerChoice(
            requested,
            f"{requested} workers, as asked",
            f"{requested} Locust worker(s) and a master on {cores} core(s): they cannot each have"
            " a core, so they queue for the CPU and their timings lag (use load.workers = \"auto\""
            f" or at most {room}; `quantload calibrate` measures what this machine can do)",
        )
    return WorkerChoice(requested, f"{requested} workers, as asked" if requested else "one process, as asked")


def most_workers(settings: LoadSettings, cores: int | None = None) -> int:
    """The most workers any experiment of `settings` runs on this machine (whose /metrics ports
    a Prometheus configuration must list before the load starts)."""
    largest = max(max(settings.users, default=1), settings.open_loop_users, settings.prefix_users)
    return choose_workers(settings.workers, largest, usable_cores() if cores is None else cores).workers


@dataclass(frozen=True)
class LoadProcess:
    """One process to start for a plan: its role, its command line and its log file's name."""

    role: Role
    argv: tuple[str, ...]
    log_name: str


class ProcessLayout(Protocol):
    """The processes that run one plan; the first one drives it, and its exit ends the load."""

    def processes(self, plan_path: Path, run_dir: Path, invocation: str) -> list[LoadProcess]: ...


@dataclass(frozen=True)
class LocustProcesses:
    """The real layout: one local Locust process, or a master and `workers` workers on loopback."""

    workers: int
    metrics_host: str
    metrics_port: int
    python: str = sys.executable

    def processes(self, plan_path: Path, run_dir: Path, invocation: str) -> list[LoadProcess]:
        base = (self.python, "-m", ENTRY_MODULE, "--metrics-host", self.metrics_host)
        common = ("--plan", str(plan_path), "--out", str(run_dir))
        port = self.metrics_port
        if self.workers == 0:
            argv = (*base, "--role", "local", *common, "--metrics-port", str(port))
            return [LoadProcess("local", argv, f"locust-{invocation}-local.log")]
        master_port = str(free_port())
        master = (
            *base, "--role", "master", *common, "--metrics-port", str(port),
            "--master-port", master_port, "--expect-workers", str(self.workers),
        )  # fmt: skip
        layout = [LoadProcess("master", master, f"locust-{invocation}-master.log")]
        for index in range(self.workers):
            worker_port = port + 1 + index if port else 0
            worker = (
                *base, "--role", "worker", "--master-port", master_port,
                "--metrics-port", str(worker_port),
            )  # fmt: skip
            layout.append(LoadProcess("worker", worker, f"locust-{invocation}-worker{index}.log"))
        return layout
