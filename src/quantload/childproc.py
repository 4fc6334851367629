"""A long-running child process (llama-server, Prometheus) with its output kept in a log file."""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

import httpx

POLL_S = 0.2


class LoggedProcess:
    """Starts one command with stdout and stderr appended to `log_path`; stops it by its own PID.

    Subclasses implement `start` (launch and wait until ready); `with` starts and stops them.
    """

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def launch(self, command: Sequence[str]) -> None:
        """Start `command`, writing the command line itself first into the log."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        with self.log_path.open("ab") as log:
            log.write(("$ " + " ".join(command) + "\n").encode())
            log.flush()
            self._process = subprocess.Popen(
                list(command), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL
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
