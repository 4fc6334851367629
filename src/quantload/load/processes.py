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

Workers on other hosts (`load.remote_workers`, each a `quantload load-worker`): the master listens
on `load.master_host`:`load.master_port` (Locust's 5557 unless set) instead of a free loopback
port, and waits for them besides its own workers; they rejoin each new master on that address.
"""

from __future__ import annotations

__all__ = [
    "LoadProcess",
    "WorkersSetting",
    "choose_workers",
    "master_listen_port",
    "most_workers",
    "usable_cores",
    "workers_absent",
]

import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol

from quantload.config import LoadSettings
from quantload.llamacpp.server import free_port

if TYPE_CHECKING:
    from quantload.load.summary import StageSummary

Role = Literal["local", "master", "worker"]
WorkersSetting = int | Literal["auto"]
STREAMS_PER_PROCESS = 256  # one process measured these within 5 ms here (quantload calibrate)
ENTRY_MODULE = "quantload.load.in_locust.process"
# the line a load process prints (to its log) when it fails; the supervisor shows what follows it
FAILURE_MARKER = "quantload load process failed: "
# what a stage's reason says when the master's workers did not all join in time (the CLI stops there)
WORKERS_MISSING = "workers connected within"
WORKERS_TIMEOUT_S = 60.0  # how long a master waits for its workers unless load.workers_timeout_s says
LOCUST_MASTER_PORT = 5557  # Locust's own default, and the compose stack's
# a worker whose master answers nothing for this long ends (quantload.load.in_locust.master_watch)
MASTER_SILENT_LIMIT_S = 15.0
MASTER_LOST_EXIT = 3  # its exit code then: the worker loop starts a new one, counting no plan
ANY_ADDRESS = ("0.0.0.0", "::", "")


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
    """The real layout: one local Locust process, or a master with `workers` workers of its own on
    this machine and `remote_workers` that join it from other hosts."""

    workers: int
    metrics_host: str
    metrics_port: int
    python: str = sys.executable
    remote_workers: int = 0
    master_host: str = "127.0.0.1"
    master_port: int = 0
    workers_timeout_s: float = WORKERS_TIMEOUT_S

    def processes(self, plan_path: Path, run_dir: Path, invocation: str) -> list[LoadProcess]:
        base = (self.python, "-m", ENTRY_MODULE, "--metrics-host", self.metrics_host)
        common = ("--plan", str(plan_path), "--out", str(run_dir))
        port = self.metrics_port
        host = self.metrics_host
        if self.workers == 0 and self.remote_workers == 0:
            argv = (*base, "--role", "local", *common, "--metrics-port", str(port))
            return [LoadProcess("local", argv, f"locust-{invocation}-local.log", host, port)]
        master_port = str(self.listen_port())
        master = (
            *base, "--role", "master", *common, "--metrics-port", str(port),
            "--master-host", self.master_host, "--master-port", master_port,
            "--expect-workers", str(self.workers + self.remote_workers),
            "--workers-timeout", f"{self.workers_timeout_s:g}",
        )  # fmt: skip
        layout = [LoadProcess("master", master, f"locust-{invocation}-master.log", host, port)]
        reach = "127.0.0.1" if self.master_host in ANY_ADDRESS else self.master_host
        for index in range(self.workers):
            worker_port = port + 1 + index if port else 0
            worker = (
                *base, "--role", "worker", "--master-host", reach, "--master-port", master_port,
                "--metrics-port", str(worker_port),
            )  # fmt: skip
            log_name = f"locust-{invocation}-worker{index}.log"
            layout.append(LoadProcess("worker", worker, log_name, host, worker_port))
        return layout

    def listen_port(self) -> int:
        """The port the master listens on (`master_listen_port`)."""
        return master_listen_port(self.master_host, self.master_port, self.remote_workers)


def workers_absent(summaries: Sequence[StageSummary]) -> str | None:
    """The reason every stage of an experiment gave when its workers did not join, else None."""
    reasons = [s.reason or "" for s in summaries]
    if reasons and all(WORKERS_MISSING in reason for reason in reasons):
        return reasons[0]
    return None


def master_listen_port(master_host: str, master_port: int, remote_workers: int) -> int:
    """The master's port: as set; else Locust's 5557 when workers on other hosts must find it,
    a free port when only this machine's do."""
    if master_port:
        return master_port
    if remote_workers:
        return LOCUST_MASTER_PORT
    local = master_host in ANY_ADDRESS or ":" in master_host
    return free_port("127.0.0.1" if local else master_host)
