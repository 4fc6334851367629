"""Reads are stamped with when their bytes arrived, not when the client got round to reading them,
and every read says which clock its time came from."""

from __future__ import annotations

import socket
import sys
import time
from collections.abc import Iterator

import pytest

from quantload.load.arrival import StampSwitch, enable_kernel_stamps, read_stamped
from quantload.load.client import ConnectionPool, Endpoint

LATE_READ_S = 0.2
linux_only = pytest.mark.skipif(sys.platform != "linux", reason="kernel receive times are a Linux socket option")


@pytest.fixture
def connected() -> Iterator[tuple[socket.socket, socket.socket]]:
    listener = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(listener.getsockname())
    receiver, _ = listener.accept()
    listener.close()
    yield sender, receiver
    sender.close()
    receiver.close()


@pytest.fixture
def stamping_on() -> Iterator[StampSwitch]:
    """The kernel's stamping switched on and held on (Linux turns it on lazily, later on a busy
    machine: what the load client does before its first request)."""
    switch = StampSwitch()
    assert switch.wait_on(10.0), "the kernel's receive stamping never came on"
    yield switch
    switch.close()


@linux_only
def test_a_late_read_still_gets_the_arrival_time(
    connected: tuple[socket.socket, socket.socket], stamping_on: StampSwitch
) -> None:
    sender, receiver = connected
    assert enable_kernel_stamps(receiver)
    view = memoryview(bytearray(1024))
    sent = time.perf_counter()
    sender.sendall(b"data: x\n\n")
    time.sleep(LATE_READ_S)  # the client is busy elsewhere
    reading = time.perf_counter()
    count, arrived, from_kernel = read_stamped(receiver, view, kernel_stamps=True)
    assert count == 9 and from_kernel
    assert sent <= arrived + 0.001  # not before the send (1 ms for the two clocks' readings)
    # well before the read: the stamp is the arrival, not the read (a busy machine may delay the
    # sender or the kernel's delivery a little, never by half the late read)
    assert reading - arrived > LATE_READ_S / 2


@linux_only
def test_bytes_the_kernel_did_not_stamp_say_their_time_is_the_read_s(
    connected: tuple[socket.socket, socket.socket],
) -> None:
    """What a read gets while the kernel's stamping is not on yet: no stamp, so the read's own time,
    and it says so (the receiver here never asked for stamps, which gives the same segments)."""
    sender, receiver = connected
    view = memoryview(bytearray(1024))
    sender.sendall(b"data: x\n\n")
    time.sleep(LATE_READ_S)
    reading = time.perf_counter()
    count, arrived, from_kernel = read_stamped(receiver, view, kernel_stamps=True)
    assert count == 9 and not from_kernel and arrived >= reading


def test_without_kernel_stamps_a_read_is_stamped_when_it_returns(
    connected: tuple[socket.socket, socket.socket],
) -> None:
    sender, receiver = connected
    view = memoryview(bytearray(1024))
    sent = time.perf_counter()
    sender.sendall(b"data: x\n\n")
    time.sleep(LATE_READ_S)
    count, arrived, from_kernel = read_stamped(receiver, view, kernel_stamps=False)
    assert count == 9 and arrived - sent >= LATE_READ_S and not from_kernel


@linux_only
def test_plain_http_connections_ask_for_kernel_stamps_and_wait_until_they_are_on() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    try:
        pool = ConnectionPool(Endpoint.from_url(f"http://127.0.0.1:{listener.getsockname()[1]}"))
        sock = pool.connect(5.0)
        sock.close()
        assert pool.kernel_stamps and pool._stamps.on  # held on until the pool closes
    finally:
        pool.close()
        listener.close()
    assert not pool._stamps.on


@linux_only
def test_every_request_says_which_clock_its_arrivals_came_from() -> None:
    from quantload.load.client import stream_request
    from quantload.load.fakeserver import FakeScript, FakeServer

    with FakeServer(FakeScript(ttft_ms=(5.0, 5.0), itl_ms=(1.0, 1.0), tokens=3)) as server:
        endpoint = Endpoint.from_url(server.url)
        pool = ConnectionPool(endpoint)
        try:
            body = b'{"messages": [{"role": "user", "content": "hi"}], "stream": true}'
            result = stream_request(pool, endpoint.request_bytes(body), 10.0)
        finally:
            pool.close()
    assert result.ok, result.error
    assert result.arrival_clock == "kernel" and result.reads_read_stamped == 0
