"""A delaying TCP relay: the network delay this machine's kernel cannot add (it has no `netem`).

    python tests/netns_relay.py --listen 10.213.77.14:8083 --to 10.213.77.10:8083 --rtt-ms 20

Every connection accepted on --listen gets a connection of its own to --to, and bytes are carried
both ways, each chunk held rtt/2 before it is passed on: a delay line (order and gaps kept,
nothing batched, Nagle off on both sides), with a stream's end passed on the same way. So a
request and its answer take --rtt-ms longer, as on a link with that round-trip time; opening the
connection itself is not delayed (the relay answers the handshake), which the load client does not
count in TTFT anyway. Prints "relay ready HOST:PORT" once it listens; runs until SIGTERM or Ctrl-C.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import signal
import socket
import sys

READ_BYTES = 65536


def _address(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host, int(port)


def _no_delay(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


# A timer of the event loop wakes up to a millisecond after it is due (epoll's timeout is in whole
# milliseconds, rounded up), once for the request and once for the answer: 20 ms asked added
# 21.6-22.7 ms at TTFT p50. The last SPIN_S before a chunk is due are waited out by yielding.
SPIN_S = 0.002


async def _carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, hold_s: float) -> None:
    """Pass every chunk from `reader` to `writer` `hold_s` after it arrived; then the end."""
    loop = asyncio.get_running_loop()
    line: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()

    async def take() -> None:
        try:
            while True:
                data = await reader.read(READ_BYTES)
                line.put_nowait((loop.time() + hold_s, data))
                if not data:
                    return
        except OSError:
            line.put_nowait((loop.time() + hold_s, b""))

    taker = asyncio.create_task(take())
    try:
        while True:
            due, data = await line.get()
            wait = due - loop.time()
            if wait > SPIN_S:
                await asyncio.sleep(wait - SPIN_S)
            while loop.time() < due:  # the last moments by yielding: see SPIN_S
                await asyncio.sleep(0)
            if not data:
                with contextlib.suppress(OSError):
                    if writer.can_write_eof():
                        writer.write_eof()
                return
            writer.write(data)
            await writer.drain()
    finally:
        taker.cancel()


async def _relay(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    upstream: tuple[str, int],
    hold_s: float,
) -> None:
    _no_delay(client_writer)
    try:
        server_reader, server_writer = await asyncio.open_connection(*upstream)
    except OSError:
        client_writer.close()
        return
    _no_delay(server_writer)
    try:
        await asyncio.gather(
            _carry(client_reader, server_writer, hold_s),
            _carry(server_reader, client_writer, hold_s),
            return_exceptions=True,
        )
    finally:
        for writer in (server_writer, client_writer):
            with contextlib.suppress(OSError):
                writer.close()


async def serve(listen: tuple[str, int], upstream: tuple[str, int], rtt_s: float) -> None:
    """Relay connections on `listen` to `upstream`, rtt_s/2 each way, until cancelled."""
    hold_s = rtt_s / 2

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(asyncio.CancelledError):  # the relay is stopping
            await _relay(reader, writer, upstream, hold_s)

    server = await asyncio.start_server(handle, *listen, backlog=1024)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    host, port = server.sockets[0].getsockname()[:2]
    sys.stdout.write(f"relay ready {host}:{port}\n")
    sys.stdout.flush()
    async with server:
        await stop.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--listen", type=_address, required=True, help="HOST:PORT to accept on")
    parser.add_argument("--to", type=_address, required=True, help="HOST:PORT to relay to")
    parser.add_argument("--rtt-ms", type=float, default=0.0, help="round-trip time added, ms")
    args = parser.parse_args(argv)
    asyncio.run(serve(args.listen, args.to, args.rtt_ms / 1000))
    return 0


if __name__ == "__main__":
    sys.exit(main())
