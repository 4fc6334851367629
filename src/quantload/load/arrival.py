"""When response bytes arrived: the kernel's receive time where the platform gives it.

A load client that is busy, or waiting for a core, reads a socket some time after the bytes got
there; stamping the read with the clock at that moment counts the client's own delay as the
server's latency. On Linux each TCP socket can ask the kernel for the receive time of the data a
read returns (`SO_TIMESTAMPNS`: the arrival of the last segment in it), so a late read still
gets the time the bytes arrived. The kernel gives wall-clock time; it becomes a `perf_counter`
time by its age at the moment of the read. Where the option is missing (other systems, TLS
sockets, which have no `recvmsg`) a read is stamped when it returns, as before.
"""

from __future__ import annotations

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


def read_stamped(sock: socket.socket, view: memoryview, kernel_stamps: bool) -> tuple[int, float]:
    """Read into `view`; return the byte count and when they arrived (`time.perf_counter` s)."""
    if not kernel_stamps:
        count = sock.recv_into(view)
        return count, time.perf_counter()
    count, ancillary, _flags, _address = sock.recvmsg_into([view], ANCILLARY_BYTES)
    now = time.perf_counter()
    wall = time.time()
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS and len(data) >= _TIMESPEC.size:
            seconds, nanoseconds = _TIMESPEC.unpack_from(data)
            age = wall - (seconds + nanoseconds * 1e-9)
            if 0.0 <= age < MAX_AGE_S:
                return count, now - age
            break
    return count, now
