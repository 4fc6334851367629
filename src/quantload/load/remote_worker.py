"""A load host's Locust worker for a `quantload load --remote-workers N` running on another host.

`quantload load` starts a Locust master for every experiment at every server, each on the same
address (`load.master_host`:`load.master_port`), and every master tells its workers to quit when
its plan ends. So `WorkerLoop` runs one worker process per plan (`python -m
quantload.load.in_locust.process --role worker`) and starts the next one as soon as the last has
ended: the host joins every plan in turn, until it is stopped (Ctrl-C or SIGTERM) or has served
`plans` of them. A worker waits for its master as long as Locust's own connection retries last
(5 minutes); its request metrics are served on `metrics_host`:`metrics_port` while it runs.

A worker whose master went silent (it joined a master that was quitting:
quantload.load.in_locust.master_watch) exits with `MASTER_LOST_EXIT` after
`MASTER_SILENT_LIMIT_S`; the loop starts the next at once and counts neither a plan nor a failure.

Bounded: a worker that fails (exits with an error) within `FAST_FAILURE_S` of its start,
`FAILED_STARTS_LIMIT` times in a row, ends the loop with `LoadError` and the cause it printed
(e.g. a master address that is not one); a worker that ran a plan resets the count. Each worker's
output is appended to one log file.
"""

from __future__ import annotations

__all__ = ["WorkerLoop", "worker_argv"]

import logging
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from quantload.childproc import start_child, stop_group
from quantload.load.plan import API_KEY_ENV
from quantload.load.processes import ENTRY_MODULE, LOCUST_MASTER_PORT, MASTER_LOST_EXIT
from quantload.load.supervisor import LoadError, failure_cause

FAST_FAILURE_S = 30.0
FAILED_STARTS_LIMIT = 3
STOP_GRACE_S = 10.0

_log = logging.getLogger(__name__)


def worker_argv(
    master_host: str,
    master_port: int = LOCUST_MASTER_PORT,
    metrics_host: str = "127.0.0.1",
    metrics_port: int = 0,
    python: str = sys.executable,
) -> list[str]:
    """The command line of one worker process joining the master at master_host:master_port."""
    return [
        python, "-m", ENTRY_MODULE, "--role", "worker",
        "--master-host", master_host, "--master-port", str(master_port),
        "--metrics-host", metrics_host, "--metrics-port", str(metrics_port),
    ]  # fmt: skip


@dataclass(frozen=True)
class WorkerEnded:
    """One worker process that ended: its number, exit code and how long it ran."""

    number: int
    returncode: int
    ran_s: float


class WorkerLoop:
    """Runs `argv` again each time it ends (see the module docstring)."""

    def __init__(
        self,
        argv: Sequence[str],
        log_path: Path,
        api_key: str | None = None,
        plans: int = 0,
        on_event: Callable[[str], None] = _log.info,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.argv = list(argv)
        self.log_path = log_path
        self.api_key = api_key
        self.plans = plans
        self.on_event = on_event
        base = dict(os.environ if environ is None else environ)
        base.pop(API_KEY_ENV, None)
        base["PYTHONUNBUFFERED"] = "1"
        if api_key:
            base[API_KEY_ENV] = api_key
        self.env = base
        self.ended: list[WorkerEnded] = []

    def run(self) -> list[WorkerEnded]:
        """Run workers until stopped or `plans` have ended well; LoadError when they keep failing."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        failed_in_a_row = 0
        done = 0
        number = 0
        while not self.plans or done < self.plans:
            number += 1
            ended = self._one(number)
            self.ended.append(ended)
            if ended.returncode == 0:
                done += 1
                failed_in_a_row = 0
                self.on_event(f"worker {number} ended its plan after {ended.ran_s:.1f} s")
                continue
            if ended.returncode == MASTER_LOST_EXIT:
                self.on_event(
                    f"worker {number} lost its master after {ended.ran_s:.1f} s (it had ended"
                    " without this worker); joining the next"
                )
                continue
            cause = failure_cause(self.log_path, ended.returncode)
            self.on_event(f"worker {number} failed after {ended.ran_s:.1f} s: {cause}")
            failed_in_a_row = failed_in_a_row + 1 if ended.ran_s < FAST_FAILURE_S else 0
            if failed_in_a_row >= FAILED_STARTS_LIMIT:
                raise LoadError(
                    f"the load worker failed {failed_in_a_row} times in a row: {cause}",
                    f"its log: {self.log_path}",
                )
        return self.ended

    def _one(self, number: int) -> WorkerEnded:
        started = time.monotonic()
        with self.log_path.open("ab") as log:
            log.write(f"--- worker {number}: {' '.join(self.argv)}\n".encode())
            log.flush()
            process = start_child(
                self.argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=self.env
            )
        self.on_event(f"worker {number} (pid {process.pid}) waiting for its master")
        try:
            returncode = process.wait()
        except BaseException:  # Ctrl-C, SIGTERM: the worker goes with us
            stop_group(process, STOP_GRACE_S)
            raise
        return WorkerEnded(number, returncode, time.monotonic() - started)

