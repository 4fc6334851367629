"""Reads are stamped with when their bytes arrived, not when the client got round to reading them."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator

import pytest

from quantload.load.arrival import enable_kernel_stamps, read_stamped
from quantload.load.client import ConnectionPool, Endpoint

LATE_READ_S = 0.2


@pytest.fixture
def connected() -> Iterator[tuple[socket.socket, socket.socket]]:
    listener = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(listener.getsockname())
    receiver, _ = listener.accept()
    listener.close()
    yield sender, receiver
    sender.close()
    receiver.close()


@pytest.mark.skipif(sys.platform != "linux", reason="kernel receive times are a Linux socket option")
def test_a_late_read_still_gets_the_arrival_time(connected: tuple[socket.socket, socket.socket]) -> None:
    sender, receiver = connected
    assert enable_kernel_stamps(receiver)
    view = memoryview(bytearray(1024))
    sent = time.perf_counter()
    sender.sendall(b"data: x\n\n")
    time.sleep(LATE_READ_S)  # the client is busy elsewhere
    reading = time.perf_counter()
    count, arrived = read_stamped(receiver, view, kernel_stamps=True)
    assert count == 9
    assert sent <= arrived + 0.001  # not before the send (1 ms for the two clocks' readings)
    # well before the read: the stamp is the arrival, not the read (a busy machine may delay the
    # sender or the kernel's delivery a little, never by half the late read)
    assert reading - arrived > LATE_READ_S / 2


def test_without_kernel_stamps_a_read_is_stamped_when_it_returns(
    connected: tuple[socket.socket, socket.socket],
) -> None:
    sender, receiver = connected
    view = memoryview(bytearray(1024))
    sent = time.perf_counter()
    sender.sendall(b"data: x\n\n")
    time.sleep(LATE_READ_S)
    count, arrived = read_stamped(receiver, view, kernel_stamps=False)
    assert count == 9 and arrived - sent >= LATE_READ_S


@pytest.mark.skipif(sys.platform != "linux", reason="kernel receive times are a Linux socket option")
def test_plain_http_connections_ask_for_kernel_stamps() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        pool = ConnectionPool(Endpoint.from_url(f"http://127.0.0.1:{listener.getsockname()[1]}"))
        sock = pool.connect(5.0)
        sock.close()
    finally:
        listener.close()
    assert pool.kernel_stamps
