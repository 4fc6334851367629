"""A stop signal reaches the main thread even when the kernel hands it to another thread.

Linux may deliver a signal sent to the process to any of its threads. Python then runs the
handler in the main thread, but only once that thread runs Python code again: blocked in a wait
without a timeout (an event loop with nothing to do, a wait for a child's exit) it never does, and
the command does not stop. `quantload calibrate --serve-fake` was once found still serving an hour
after its SIGTERM for this reason. `StopRelay` reads each signal's number from Python's wakeup file
descriptor and, for a stop signal, nudges the main thread with a signal of its own (`NUDGE`, whose
handler does nothing): its wait is interrupted, and Python runs whatever handler is pending, once,
whichever handler the command has installed. A nudge the main thread did not need costs nothing.
"""

from __future__ import annotations

import signal
import socket
import threading
from collections.abc import Iterable
from types import FrameType

NUDGE = signal.SIGURG  # ignored by default, so nothing else in the process relies on it


def _do_nothing(signum: int, frame: FrameType | None) -> None:
    """The nudge's handler: being a handler is what makes the main thread's wait return."""


class StopRelay:
    """Wakes the main thread for each of `signums`, wherever the kernel delivered it.

    Use as a context manager from the main thread (`signal.set_wakeup_fd` may only be set there)."""

    def __init__(self, signums: Iterable[int]) -> None:
        self._signums = frozenset(int(number) for number in signums)
        self._reader: socket.socket | None = None
        self._writer: socket.socket | None = None
        self._previous_fd = -1
        self._previous_nudge: signal.Handlers | object = signal.SIG_DFL
        self._thread = threading.Thread(target=self._relay, name="quantload-stop-relay", daemon=True)

    def __enter__(self) -> StopRelay:
        self._reader, self._writer = socket.socketpair()
        self._writer.setblocking(False)
        self._previous_nudge = signal.signal(NUDGE, _do_nothing)
        self._previous_fd = signal.set_wakeup_fd(self._writer.fileno(), warn_on_full_buffer=False)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        signal.set_wakeup_fd(self._previous_fd, warn_on_full_buffer=False)
        if self._writer is not None:
            self._writer.close()  # the relay's read then ends
        self._thread.join(timeout=1.0)
        if self._reader is not None:
            self._reader.close()
        signal.signal(NUDGE, self._previous_nudge)  # type: ignore[arg-type]

    def _relay(self) -> None:
        reader = self._reader
        main_id = threading.main_thread().ident
        if reader is None or main_id is None:
            return
        while True:
            try:
                data = reader.recv(64)
            except OSError:
                return
            if not data:
                return
            if any(signum in self._signums for signum in data):
                signal.pthread_kill(main_id, NUDGE)
