"""Child processes: a long-running one (llama-server, Prometheus) with its output kept in a log
file, and what every child quantload starts gets: a process group of its own, stopped as a group,
it dies with its parent, and its logged command line shows no secret.

A group of its own: `start_child` starts every child quantload runs (llama-server, Prometheus, the
llama.cpp tools, Locust processes, the fake servers) as the leader of a new process group, and
`stop_group` signals that whole group and waits, within its bound, until no process of it is left.
So whatever the child started lives and ends with it: a wrapper script given as `llama-server`
(setting LD_LIBRARY_PATH, then running the real binary) leaves no server on its port after a stop,
a restart, a start that timed out, or the wrapper's own exit. A stop signal (Ctrl-C, SIGTERM,
SIGHUP) that arrives while a child starts is held until its handle is kept, so no child is started
unseen and left out of a stop.

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
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import httpx

POLL_S = 0.2
STOP_GRACE_S = 10.0  # a stopped group's processes get this long to end on SIGTERM
KILL_WAIT_S = 5.0  # and this long to be gone after SIGKILL
GROUP_POLL_S = 0.02
PR_SET_PDEATHSIG = 1  # linux/prctl.h
HELD_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGHUP})
SECRET_FLAGS = frozenset({"--api-key", "--hf-token", "--token", "--password"})
MASK = "***"


def die_with_parent(signal_mask: frozenset[int] | None = None) -> Callable[[], None] | None:
    """A `preexec_fn` that makes the child receive SIGTERM when its parent ends (Linux only), and
    gives it `signal_mask` (the parent's own, where the parent held some signals while starting it).

    The libc function is looked up here, in the parent, so the child only makes one call
    between fork and exec. A child whose parent is already gone by then exits at once.
    """
    prctl = None
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            prctl = ctypes.CDLL(None, use_errno=True).prctl
    if prctl is None and signal_mask is None:
        return None
    parent_pid = os.getpid()

    def preexec() -> None:
        if signal_mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, signal_mask)
        if prctl is not None:
            prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
            if os.getppid() != parent_pid:
                os._exit(1)

    return preexec


@contextlib.contextmanager
def _stop_signals_held() -> Iterator[frozenset[int] | None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP while a child starts (main thread, POSIX); yields the mask to
    give the child (None where nothing was held)."""
    if threading.current_thread() is not threading.main_thread() or not hasattr(signal, "pthread_sigmask"):
        yield None
        return
    before = signal.pthread_sigmask(signal.SIG_BLOCK, HELD_SIGNALS)
    try:
        yield frozenset(int(number) for number in before)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


def start_child(
    command: Sequence[str],
    kept: Callable[[subprocess.Popen[Any]], None] | None = None,
    **popen: Any,
) -> subprocess.Popen[Any]:
    """Start `command` as the leader of a process group of its own, dying with its parent (see the
    module docstring); `popen` are subprocess.Popen's other arguments. `kept` receives the handle
    before a stop signal that arrived meanwhile is let through, so the caller's stop includes it."""
    with _stop_signals_held() as mask:
        process = subprocess.Popen(list(command), process_group=0, preexec_fn=die_with_parent(mask), **popen)
        if kept is not None:
            kept(process)
    return process


def group_members(group: int) -> list[int]:
    """The live (not zombie) processes of process group `group`."""
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(group, 0)
        except ProcessLookupError:
            return []
        except PermissionError:
            pass
        return [group]
    members: list[int] = []
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text(encoding="ascii", errors="replace")
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()  # after "pid (comm) ": state ppid pgrp ...
        if len(fields) > 2 and fields[0] != "Z" and fields[2] == str(group):
            members.append(int(entry.name))
    return members


def _signal_group(group: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(group, number)


def _group_gone(process: subprocess.Popen[Any], group: int, deadline: float) -> bool:
    """Wait until the leader has ended and no process of its group is left; False at `deadline`."""
    try:
        process.wait(timeout=max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        return False
    while group_members(group):
        if time.monotonic() >= deadline:
            return False
        time.sleep(GROUP_POLL_S)
    return True


def stop_group(process: subprocess.Popen[Any], grace_s: float = STOP_GRACE_S) -> int | None:
    """Stop the process group `process` leads (start_child): SIGTERM to all of it, up to `grace_s`
    for every process of it to end, then SIGKILL and up to KILL_WAIT_S more. Returns the leader's
    exit code. The group is signalled even where the leader has already exited, since what it
    started may still run. A Ctrl-C meanwhile does not cut the wait short; it is raised after."""
    group = process.pid
    if process.returncode is not None and not group_members(group):
        return process.returncode  # stopped before, or ended whole: its number may be another's now
    interrupted = False
    _signal_group(group, signal.SIGTERM)
    for number, bound_s in ((None, grace_s), (signal.SIGKILL, KILL_WAIT_S)):
        if number is not None:
            _signal_group(group, number)
        deadline = time.monotonic() + bound_s
        while True:
            try:
                gone = _group_gone(process, group, deadline)
                break
            except KeyboardInterrupt:
                interrupted = True
        if gone:
            break
    if interrupted:
        raise KeyboardInterrupt
    return process.returncode


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
            start_child(
                command,
                self._keep,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **secret_env} if secret_env else None,
            )

    def _keep(self, process: subprocess.Popen[bytes]) -> None:
        self._process = process

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

    def stop(self, timeout_s: float = STOP_GRACE_S) -> int | None:
        """Stop the process and everything it started (its process group: SIGTERM, SIGKILL after
        `timeout_s`); return its exit code, None if never started."""
        process = self._process
        if process is None:
            return None
        return stop_group(process, timeout_s)
