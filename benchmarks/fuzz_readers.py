"""The fuzz targets of `tests/fuzz_targets.py`, at random and for longer than a test run can, and the
memory the stream reader holds against adversarial streams.

For each target it runs hypothesis in batches of fresh random examples until `--seconds` are
spent on it (or `--examples` are tried), and prints the inputs tried, the time and the failures
(hypothesis shrinks a failure to its smallest input and prints it). Then it feeds the stream
reader adversarial streams (a head, a chunk-size line, a trailer or an event that never ends, a
huge error body, a long well-formed stream) and prints the peak memory it allocated for each
(tracemalloc), which the caps must bound whatever the stream's length.

    .venv/bin/python benchmarks/fuzz_readers.py                     # 60 s per target, ~8 minutes
    .venv/bin/python benchmarks/fuzz_readers.py --seconds 5 --only framing,metrics
"""

from __future__ import annotations

import argparse
import sys
import time
import tracemalloc
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the targets are test code
import fuzz_targets as targets
from quantload.load.http1 import ProtocolError
from quantload.load.sse import EventStreamParser

BATCH = 500
TARGETS: dict[str, Callable[..., None]] = {
    "framing": targets.framing_and_sse_agree_with_the_reference,
    "bytes": targets.any_bytes_only_protocol_errors,
    "payloads": targets.payloads_never_raise,
    "verdicts": targets.stream_verdicts_are_classes,
    "metrics": targets.metrics_reader_only_server_data_errors,
    "slots": targets.slots_reader_only_server_data_errors,
    "client": targets.client_returns_a_class,
    "json_list": targets.json_list_reader_agrees_with_json_loads,
}


def run_target(
    name: str, target: Callable[..., None], seconds: float, examples: int | None
) -> dict[str, Any]:
    """Batches of random examples until the time (or the count) is spent; the failures found."""
    tried = 0
    failures: list[str] = []
    server = targets.OneAnswerServer() if name == "client" else None

    def body(data: st.DataObject) -> None:
        nonlocal tried
        tried += 1
        if server is not None:
            target(server, data)
        else:
            target(data)

    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds and (examples is None or tried < examples):
            batch = BATCH if name != "client" else BATCH // 10
            if examples is not None:
                batch = min(batch, examples - tried)
            run = settings(
                max_examples=batch,
                deadline=None,
                database=None,
                suppress_health_check=list(HealthCheck),
            )(given(st.data())(body))
            try:
                run()
            except Exception as error:  # a property failed: hypothesis has shrunk and printed it
                failures.append(f"{type(error).__name__}: {str(error).splitlines()[0][:200]}")
                break
    finally:
        if server is not None:
            server.close()
    return {"target": name, "tried": tried, "seconds": time.monotonic() - started, "failures": failures}


EVENT = b'data: {"choices":[{"delta":{"content":"tok"}}]}\n\n'


def _repeat(piece: bytes, total: int) -> Iterator[bytes]:
    for _ in range(total // len(piece)):
        yield piece


ADVERSARIES: dict[str, tuple[bytes, Callable[[], Iterator[bytes]]]] = {
    "head that never ends": (b"HTTP/1.1 200 OK\r\n", lambda: _repeat(b"X-Pad: " + b"p" * 1017, 20 << 20)),
    "chunk-size line that never ends": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
        lambda: _repeat(b"0" * 1024, 20 << 20),
    ),
    "trailer that never ends": (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n",
        lambda: _repeat(b"X-T: " + b"t" * 1017 + b"\r\n", 20 << 20),
    ),
    "event line that never ends": (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\ndata: ",
        lambda: _repeat(b"x" * 65536, 40 << 20),
    ),
    "event of endless data lines": (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n",
        lambda: _repeat(b"data: " + b"y" * 1018 + b"\n", 40 << 20),
    ),
    "error body of 40 MiB": (
        b"HTTP/1.1 500 Oops\r\nContent-Type: text/plain\r\n\r\n",
        lambda: _repeat(b"e" * 65536, 40 << 20),
    ),
    "well-formed stream of 40 MiB": (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n",
        lambda: _repeat(b"%x\r\n%s\r\n" % (len(EVENT), EVENT), 40 << 20),
    ),
}


def peak_memory(head: bytes, pieces: Callable[[], Iterator[bytes]]) -> tuple[int, int, str]:
    """Bytes fed, peak bytes allocated while feeding them (payloads dropped at once), the outcome."""
    parser = EventStreamParser()
    fed = 0
    outcome = "read to the end"
    tracemalloc.start()
    try:
        parser.feed(head)
        for piece in pieces():
            fed += len(piece)
            parser.feed(piece)
    except ProtocolError as error:
        outcome = f"ProtocolError: {error}"
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return fed, peak, outcome


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--seconds", type=float, default=60.0, help="time per target")
    parser.add_argument("--examples", type=int, default=None, help="stop a target after this many")
    parser.add_argument("--only", default="", help="comma list of targets: " + ",".join(TARGETS))
    parser.add_argument("--no-memory", action="store_true")
    args = parser.parse_args()
    chosen = [name for name in (args.only.split(",") if args.only else TARGETS) if name]
    rows = [run_target(name, TARGETS[name], args.seconds, args.examples) for name in chosen]
    print("| target | inputs tried | seconds | inputs/s | failures |")
    print("|---|---|---|---|---|")
    for row in rows:
        rate = row["tried"] / row["seconds"] if row["seconds"] else 0.0
        found = "; ".join(row["failures"]) or "none"
        print(f"| {row['target']} | {row['tried']} | {row['seconds']:.0f} | {rate:.0f} | {found} |")
    total = sum(row["tried"] for row in rows)
    print(f"total: {total} inputs in {sum(row['seconds'] for row in rows):.0f} s")
    failed = any(row["failures"] for row in rows)
    if not args.no_memory:
        print()
        print("| adversarial stream | bytes fed | peak memory held | outcome |")
        print("|---|---|---|---|")
        for name, (head, pieces) in ADVERSARIES.items():
            fed, peak, outcome = peak_memory(head, pieces)
            print(f"| {name} | {fed / 2**20:.1f} MiB | {peak / 2**20:.2f} MiB | {outcome[:70]} |")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
