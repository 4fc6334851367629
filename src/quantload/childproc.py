"""Child processes: a long-running one (llama-server, Prometheus) with its output kept in a log
file, and what every child quantload starts gets: it dies with its parent, and its logged command
line shows no secret.

Dying with the parent: on Linux each child asks the kernel for SIGTERM when the thread that
started it ends (prctl PR_SET_PDEATHSIG), so a `quantload` killed outright (SIGKILL) leaves no
llama-server, Prometheus or Locust process behind. quantload starts children from its main
thread only, which is what makes "the thread that started it" mean "quantload". Elsewhere (macOS)
the orderly stop on SIGINT/SIGTERM/SIGHUP still applies; a SIGKILL there can leave children.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

POLL_S = 0.2
PR_SET_PDEATHSIG = 1  # linux/prctl.h
SECRET_FLAGS = frozenset({"--api-key", "--hf-token", "--token", "--password"})
MASK = "***"


def die_with_parent() -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive SIGTERM when its parent ends (Linux only).

    The libc function is looked up here, in the parent, so the child only makes one call
    between fork and exec. A child whose parent is already gone by then exits at once.
    """
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent_pid = os.getpid()

    def preexec() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
        if os.getppid() != parent_pid:
            os._exit(1)

    return preexec


def shown_command(command: Sequence[str], secrets: Sequence[str] = ()) -> str:
    """The command line as logs show it: the value after a secret flag, and any of `secrets`,
    replaced by ***."""
    shown: list[str] = []
    hide_next = False
    for part in command:
        if hide_next:
            shown.append(MASK)
            hide_next = False
            continue
        flag, eq, _ = part.partition("=")
        if flag in SECRET_FLAGS:
            shown.append(f"{flag}={MASK}" if eq else part)
            hide_next = not eq
            continue
        for secret in secrets:
            if secret:
                part = part.replace(secret, MASK)
        shown.append(part)
    return " ".join(shown)


class LoggedProcess:
    """Starts one command with stdout and stderr appended to `log_path`; stops it by its own PID.

    Subclasses implement `start` (launch and wait until ready); `with` starts and stops them.
    """

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None
        self._launch_offset = 0  # where the latest launch's output starts in the log

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def launch(self, command: Sequence[str], secret_env: Mapping[str, str] | None = None) -> None:
        """Start `command`, writing the command line itself first into the log (secrets masked).

        `secret_env` holds secrets the child reads from its environment instead of its command
        line (so `ps` cannot show them); their values never reach the log either.
        """
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        secrets = tuple(secret_env.values()) if secret_env else ()
        with self.log_path.open("ab") as log:
            self._launch_offset = log.tell()
            log.write(("$ " + shown_command(command, secrets) + "\n").encode())
            log.flush()
            self._process = subprocess.Popen(
                list(command),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **secret_env} if secret_env else None,
                preexec_fn=die_with_parent(),
            )

    def alive(self) -> bool:
        """True while the process runs."""
        return self._process is not None and self._process.poll() is None

    def log_text(self) -> str:
        """Everything the process has printed so far."""
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def launch_log_text(self) -> str:
        """What the latest launch has printed (a restarted process appends to the same log)."""
        try:
            with self.log_path.open("rb") as handle:
                handle.seek(self._launch_offset)
                return handle.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def log_tail(self, lines: int = 3) -> str:
        """The process's own error lines if it printed any, else its last lines, on one line."""
        printed = [line for line in self.log_text().strip().splitlines() if line.strip()]
        errors = [line for line in printed if "error" in line.lower()]
        tail = errors[-lines:] if errors else printed[-lines:]
        return " | ".join(line.strip()[-200:] for line in tail) or "no output"

    def wait_http_ok(self, url: str, timeout_s: float) -> bool:
        """Poll `url` until it answers 200; False if the process exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        with httpx.Client(timeout=2.0) as client:
            while time.monotonic() < deadline:
                if not self.alive():
                    return False
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(url).status_code == 200:
                        return True
                time.sleep(POLL_S)
        return False

    def start(self) -> Self:
        """Launch the process and wait until it is ready."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """Terminate (kill after `timeout_s`); return the exit code, None if never started."""
        process = self._process
        if process is None:
            return None
        if process.poll() is None:
            process.terminate()
            try:
                process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=timeout_s)
        return process.returncode
