"""When response bytes arrived: the kernel's receive time where the platform gives it.

A load client that is busy, or waiting for a core, reads a socket some time after the bytes got
there; stamping the read with the clock at that moment counts the client's own delay as the
server's latency. On Linux each TCP socket can ask the kernel for the receive time of the data a
read returns (`SO_TIMESTAMPNS`: the arrival of the last segment in it), so a late read still
gets the time the bytes arrived. The kernel gives wall-clock time; it becomes a `perf_counter`
time by its age at the moment of the read. Where the option is missing (other systems, TLS
sockets, which have no `recvmsg`) a read is stamped when it returns, as before.

Linux switches receive stamping on for the whole system lazily: the first socket that asks for it
only schedules the switch on a kernel work queue, and until that work has run no segment is
stamped; the switch goes off again once the last socket that asked is closed. Measured here
(benchmarks/arrival_stamps.py): 1.5 ms from asking to the first stamped segment on a quiet
machine, up to 50 ms with a CPU-bound process on each core. A read of bytes that came in that
window carries no stamp, and used to be stamped when it returned without a word. So every read
says where its time came from (`read_stamped`'s third value, a request's `arrival_clock`), and
`StampSwitch` keeps the stamping on for as long as a load client lives, waiting until it is
really on before the first request.
"""

from __future__ import annotations

__all__ = ["StampSwitch", "enable_kernel_stamps", "read_stamped"]

import contextlib
import socket
import struct
import sys
import time

# Linux's SO_TIMESTAMPNS (the asm-generic value, 35, on x86, ARM, RISC-V, PowerPC, s390); Python's
# socket module does not name it.
SO_TIMESTAMPNS: int | None = getattr(socket, "SO_TIMESTAMPNS", 35 if sys.platform == "linux" else None)
_TIMESPEC = struct.Struct("@ll")  # struct timespec: seconds and nanoseconds, native longs
ANCILLARY_BYTES = socket.CMSG_SPACE(_TIMESPEC.size) if hasattr(socket, "CMSG_SPACE") else 0
MAX_AGE_S = 600.0  # an older stamp means the wall clock stepped: use the read's own time


def enable_kernel_stamps(sock: socket.socket) -> bool:
    """Ask the kernel to stamp what this socket receives; False where it cannot."""
    if SO_TIMESTAMPNS is None or not ANCILLARY_BYTES or not hasattr(sock, "recvmsg_into"):
        return False
    try:
        sock.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
    except OSError:
        return False
    return True


def read_stamped(sock: socket.socket, view: memoryview, kernel_stamps: bool) -> tuple[int, float, bool]:
    """Read into `view`: the byte count, when they arrived (`time.perf_counter` s), and whether
    that time is the kernel's receive time (False: the time the read returned)."""
    if not kernel_stamps:
        count = sock.recv_into(view)
        return count, time.perf_counter(), False
    count, ancillary, _flags, _address = sock.recvmsg_into([view], ANCILLARY_BYTES)
    now = time.perf_counter()
    wall = time.time()
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(data)
            age = wall - (seconds + nanoseconds * 1e-9)
            if 0.0 <= age < MAX_AGE_S:
                return count, now - age, True
            break
    return count, now, False


SWITCH_WAIT_S = 2.0  # how long a StampSwitch waits for the kernel's stamping to come on
_PROBE_GAP_S = 0.0005


class StampSwitch:
    """Holds the kernel's receive stamping on while it lives (see the module docstring).

    It keeps one loopback TCP connection whose receiving end asked for stamps, so the system-wide
    switch never goes off between a client's connections, and `wait_on` sends itself a byte at a
    time until one comes back stamped. Close it when the client is done.
    """

    def __init__(self) -> None:
        self._sender: socket.socket | None = None
        self._receiver: socket.socket | None = None
        self.on = False

    def wait_on(self, timeout_s: float = SWITCH_WAIT_S) -> bool:
        """True once a segment came stamped (at once after the first time); False where the
        platform has no stamps or they did not come on within `timeout_s`."""
        if self.on:
            return True
        try:
            if self._receiver is None:
                self._connect()
            assert self._sender is not None and self._receiver is not None
            view = memoryview(bytearray(64))
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                self._sender.sendall(b"s")
                time.sleep(_PROBE_GAP_S)
                _, _, stamped = read_stamped(self._receiver, view, kernel_stamps=True)
                if stamped:
                    self.on = True
                    return True
        except OSError:
            self.close()
        return False

    def _connect(self) -> None:
        with socket.create_server(("127.0.0.1", 0)) as listener:
            self._sender = socket.create_connection(listener.getsockname(), timeout=5.0)
            self._receiver, _ = listener.accept()
        self._receiver.settimeout(5.0)
        if not enable_kernel_stamps(self._receiver):
            raise OSError("no kernel receive stamps on this platform")

    def close(self) -> None:
        """Let the stamping go (the kernel turns it off once no socket asks for it)."""
        for sock in (self._sender, self._receiver):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()
        self._sender = self._receiver = None
        self.on = False
