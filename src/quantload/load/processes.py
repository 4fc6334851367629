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
# the line a load process prints (to its log) when it fails; the supervisor shows what follows it
FAILURE_MARKER = "quantload load process failed: "


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


def choose_workers(
    requested: WorkersSetting, max_users: int, cores: int, per_process: float | None = None
) -> WorkerChoice:
    """The worker count for a plan whose largest stage has `max_users` users, on `cores` cores;
    `per_process` is how many streams one process measured right on this machine (its latest
    `quantload calibrate`), STREAMS_PER_PROCESS when unknown."""
    room = max(cores - 1, 0)  # each worker needs a core; the master and the rest of the machine one
    bound = STREAMS_PER_PROCESS if per_process is None else max(int(per_process), 1)
    if requested == "auto":
        if max_users <= bound:
            return WorkerChoice(0, f"one process: {max_users} users fit in one (up to {bound})")
        wanted = math.ceil(max_users / bound)
        if room < 2:
            return WorkerChoice(
                0,
                f"one process: {cores} core(s) leave no room for a master and two workers",
                f"the largest stage has {max_users} users, more than the {bound} one load process"
                f" measures right here, and {cores} core(s) leave no room to spread it over workers:"
                " it runs in one process, and each stage says how far its figures can be trusted",
            )
        count = min(wanted, room)
        reason = f"{count} workers: {max_users} users over {bound} a process, {cores} cores"
        return WorkerChoice(count, reason)
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


def most_workers(settings: LoadSettings, cores: int | None = None, per_process: float | None = None) -> int:
    """The most workers any experiment of `settings` runs on this machine (whose /metrics ports
    a Prometheus configuration must list before the load starts); `per_process` as for
    `choose_workers` (the streams this machine's calibration proved, which the plans are held to)."""
    largest = max(max(settings.users, default=1), settings.open_loop_users, settings.prefix_users)
    cores = usable_cores() if cores is None else cores
    return choose_workers(settings.workers, largest, cores, per_process).workers


@dataclass(frozen=True)
class LoadProcess:
    """One process to start for a plan: its role, its command line and its log file's name, and
    where it serves /metrics (port 0: nowhere)."""

    role: Role
    argv: tuple[str, ...]
    log_name: str
    metrics_host: str = ""
    metrics_port: int = 0


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
        host = self.metrics_host
        if self.workers == 0:
            argv = (*base, "--role", "local", *common, "--metrics-port", str(port))
            return [LoadProcess("local", argv, f"locust-{invocation}-local.log", host, port)]
        master_port = str(free_port())
        master = (
            *base, "--role", "master", *common, "--metrics-port", str(port),
            "--master-port", master_port, "--expect-workers", str(self.workers),
        )  # fmt: skip
        layout = [LoadProcess("master", master, f"locust-{invocation}-master.log", host, port)]
        for index in range(self.workers):
            worker_port = port + 1 + index if port else 0
            worker = (
                *base, "--role", "worker", "--master-port", master_port,
                "--metrics-port", str(worker_port),
            )  # fmt: skip
            log_name = f"locust-{invocation}-worker{index}.log"
            layout.append(LoadProcess("worker", worker, log_name, host, worker_port))
        return layout
