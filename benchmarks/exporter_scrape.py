"""How long one scrape of the exporter takes: p50/p99 over many scrapes of its /metrics.

Default: 3 fake llama-servers (tests/fake_llama_server.py) in a child process on loopback,
each reporting 8 slots, all busy, with llama-server's exact /metrics text and /slots fields.
The exporter runs in this process, as `quantload exporter` would in its own.
With --target NAME=URL (repeatable) it scrapes real llama-servers instead.
Goal: p99 under 50 ms.

    .venv/bin/python benchmarks/exporter_scrape.py [--scrapes 500] [--target a=http://...]
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import statistics
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path

import httpx

from quantload.exporter import ExporterTarget, parse_target, start_exporter
from quantload.stats import percentile

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))  # the fake is test code
from fake_llama_server import FakeLlamaServer, slots_payload

GOAL_P99_S = 0.050


def _serve_fakes(count: int, slots: int, pipe: Connection) -> None:
    """Child process: run `count` fake servers until the parent closes the pipe."""
    fakes = []
    for _ in range(count):
        fake = FakeLlamaServer().start()
        fake.slots = slots_payload(n_slots=slots, busy=slots, tokens=700)
        fakes.append(fake)
    pipe.send([fake.url for fake in fakes])
    with contextlib.suppress(EOFError):
        pipe.recv()
    for fake in fakes:
        fake.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scrapes", type=int, default=500)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--target", action="append", default=[], help="NAME=URL of a real server")
    args = parser.parse_args()

    child: multiprocessing.Process | None = None
    parent_end: Connection | None = None
    if args.target:
        targets = [parse_target(spec) for spec in args.target]
        kind = "real llama-server"
    else:
        parent_end, child_end = multiprocessing.Pipe()
        child = multiprocessing.Process(
            target=_serve_fakes, args=(args.servers, args.slots, child_end), daemon=True
        )
        child.start()
        urls = parent_end.recv()
        targets = [
            ExporterTarget(name=f"s{i}", url=url, quant="Q8_0", model="fake") for i, url in enumerate(urls)
        ]
        kind = f"fake llama-server in a child process ({args.slots} slots each, all busy)"
    exporter = start_exporter(targets, port=0, timeout_s=0.5)
    durations: list[float] = []
    size = 0
    try:
        with httpx.Client(timeout=5) as client:
            for _ in range(20):  # warm up connections and code paths
                client.get(f"{exporter.url}/metrics")
            for _ in range(args.scrapes):
                started = time.perf_counter()
                response = client.get(f"{exporter.url}/metrics")
                durations.append(time.perf_counter() - started)
                size = len(response.content)
    finally:
        exporter.stop()
        if child is not None and parent_end is not None:
            parent_end.send("stop")
            child.join(timeout=10)
    durations.sort()
    p50, p99 = percentile(durations, 50) or 0.0, percentile(durations, 99) or 0.0
    print(f"targets: {len(targets)} x {kind}; scrapes: {len(durations)}; body: {size} bytes")
    print(
        f"scrape duration (GET /metrics on the exporter): p50 {p50 * 1000:.1f} ms, "
        f"p99 {p99 * 1000:.1f} ms, mean {statistics.fmean(durations) * 1000:.1f} ms, "
        f"max {durations[-1] * 1000:.1f} ms"
    )
    verdict = "met" if p99 < GOAL_P99_S else "MISSED"
    print(f"goal p99 < {GOAL_P99_S * 1000:.0f} ms: {verdict}")
    return 0 if p99 < GOAL_P99_S else 1


if __name__ == "__main__":
    raise SystemExit(main())
