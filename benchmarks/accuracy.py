"""How accurately quantload's Locust client measures streams, against the floor, on this machine.

For each concurrency (1, 8, 64, 256 by default) it starts the fake server (scripted TTFT 20-200 ms,
inter-token gaps 5-20 ms, 16 tokens, pathological chunks on), runs the raw-asyncio floor client,
restarts the server, runs quantload's own load path (a one-stage closed-loop plan through
`quantload.load.supervisor.run_plan`, i.e. a real Locust process with the production user class), and
judges every request exactly: error = measured minus the scripted value the server reports in
`timings`. It prints one table and writes it, with the raw numbers, under benchmarks/figures/.

    .venv/bin/python benchmarks/accuracy.py                 # about 2-3 minutes
    .venv/bin/python benchmarks/accuracy.py --streams 8,64 --scale 0.5

Goals (issue 7): at 64 streams p99 TTFT error within 2x the floor's; at 8 streams p99 within 5 ms;
no error below zero; delivered concurrency equal to the asked one. Run it on a quiet machine:
client and server share the cores, so anything else running shows up as error.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quantload.config import LoadSettings
from quantload.load.plan import sweep_plan
from quantload.load.prompts import Prompt
from quantload.load.records import iter_records, iter_stage_events
from quantload.load.summary import delivered_concurrency
from quantload.load.supervisor import run_plan
from quantload.served import ServedTarget
from quantload.stats import percentile

HERE = Path(__file__).resolve().parent
REQUESTS = {1: 60, 8: 300, 64: 500, 256: 1000}
TTFT_MS = "20,200"
ITL_MS = "5,20"
TOKENS = 16


class FakeServerProcess:
    """The fake server in its own process (its own core time, like a real server)."""

    def __init__(self, folder: Path, seed: int) -> None:
        self.port_file = folder / f"port-{seed}"
        self.process = subprocess.Popen(
            [
                sys.executable, "-m", "quantload.load.fakeserver", "--port", "0",
                "--port-file", str(self.port_file), "--ttft-ms", TTFT_MS, "--itl-ms", ITL_MS,
                "--tokens", str(TOKENS), "--seed", str(seed),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 20
        while not self.port_file.exists():
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError("fake server did not start")
            time.sleep(0.05)
        self.url = f"http://127.0.0.1:{self.port_file.read_text().strip()}"

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(10)


def errors_of(
    rows: list[dict[str, Any]],
) -> tuple[list[float], list[float], list[tuple[float, float]], list[float]]:
    """TTFT errors, ITL errors, (start, end) of successful requests, server lateness (ms)."""
    ttft, itl, intervals, late = [], [], [], []
    for row in rows:
        timings = row.get("timings") or {}
        times = row.get("content_times_s") or []
        if row.get("ttft_s") is None or "prompt_ms" not in timings:
            continue
        ttft.append(row["ttft_s"] * 1000 - timings["prompt_ms"])
        gap_ms = timings.get("predicted_per_token_ms")
        if gap_ms is not None:
            itl += [(b - a) * 1000 - gap_ms for a, b in itertools.pairwise(times)]
        intervals.append((row["sent_unix_s"], row["sent_unix_s"] + row["e2e_s"]))
        late.append(timings.get("first_token_late_ms", 0.0))
    return ttft, itl, intervals, late


def run_floor(url: str, streams: int, requests: int, jitter_s: float, folder: Path) -> dict[str, Any]:
    out = folder / f"floor-{streams}.json"
    subprocess.run(
        [
            sys.executable, str(HERE / "floor_client.py"), "--url", url, "--streams", str(streams),
            "--requests", str(requests), "--max-tokens", str(TOKENS), "--jitter-s", str(jitter_s),
            "--out", str(out),
        ],
        check=True,
        timeout=600,
    )  # fmt: skip
    data = json.loads(out.read_text())
    ttft, itl, intervals, late = errors_of(data["records"])
    return {
        "ttft": ttft, "itl": itl, "late": late, "concurrency": delivered_concurrency(intervals, streams),
        "cpu_frac": data["cpu_s"] / data["wall_s"], "ok": len(ttft), "requests": requests,
    }  # fmt: skip


def run_quantload(url: str, streams: int, requests: int, jitter_s: float, folder: Path) -> dict[str, Any]:
    run_dir = folder / f"quantload-{streams}-{len(list(folder.glob('quantload-*')))}"
    settings = LoadSettings(
        users=(streams,), repeats=1, warmup_requests=0, max_tokens=TOKENS, request_timeout_s=60,
        first_round_jitter_s=jitter_s, metrics_port=0, max_consecutive_errors=50,
    )  # fmt: skip
    prompts = [Prompt(f"b{i}", f"benchmark request {i}", 4) for i in range(requests)]
    target = ServedTarget(name="fake", quant="none", model="fake", url=url)
    plan = sweep_plan(settings, target, prompts, "accuracy", f"acc{streams}")
    run_plan(plan, settings, run_dir)
    rows = []
    for record in iter_records(run_dir / "records.jsonl"):
        if record.ok and record.ttft_s is not None:
            times = [record.ttft_s]
            for gap in record.itl_s or ():
                times.append(times[-1] + gap)
            rows.append({
                "sent_unix_s": record.sent_unix_s, "ttft_s": record.ttft_s, "e2e_s": record.e2e_s,
                "content_times_s": times, "timings": record.timings,
            })  # fmt: skip
    ends = [e for e in iter_stage_events(run_dir / "stages.jsonl") if e.event == "stage_end"]
    ttft, itl, intervals, late = errors_of(rows)
    return {
        "ttft": ttft, "itl": itl, "late": late, "concurrency": delivered_concurrency(intervals, streams),
        "cpu_frac": ends[0].client_cpu_frac if ends else None, "ok": len(ttft), "requests": requests,
        "saturated": ends[0].client_saturated if ends else None,
    }  # fmt: skip


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    p50, p99 = percentile(values, 50), percentile(values, 99)
    return f"{p50:.1f} / {p99:.1f} / {min(values):.1f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| streams | quantload TTFT err p50/p99/min ms | floor TTFT err p50/p99/min ms | p99 ratio |"
        " quantload ITL err p50/p99 ms | floor ITL err p50/p99 ms | delivered (ql / floor) |"
        " client CPU % of a core (ql / floor) | server late p99 ms (ql / floor) | ok (ql / floor) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ql, fl = row["quantload"], row["floor"]
        ratio = "-"
        if ql["ttft"] and fl["ttft"]:
            ratio = f"{(percentile(ql['ttft'], 99) or 0) / max(percentile(fl['ttft'], 99) or 1e-9, 1e-9):.2f}"

        def itl(side: dict[str, Any]) -> str:
            values = side["itl"]
            return f"{percentile(values, 50):.1f} / {percentile(values, 99):.1f}" if values else "-"

        def pct(value: float | None) -> str:
            return "-" if value is None else f"{100 * value:.0f}"

        def conc(value: float | None) -> str:
            return "-" if value is None else f"{value:.1f}"

        lines.append(
            f"| {row['streams']} | {fmt(ql['ttft'])} | {fmt(fl['ttft'])} | {ratio} | {itl(ql)} | {itl(fl)} |"
            f" {conc(ql['concurrency'])} / {conc(fl['concurrency'])} |"
            f" {pct(ql['cpu_frac'])} / {pct(fl['cpu_frac'])} |"
            f" {percentile(ql['late'], 99) or 0:.1f} / {percentile(fl['late'], 99) or 0:.1f} |"
            f" {ql['ok']}/{ql['requests']} / {fl['ok']}/{fl['requests']} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--streams", default="1,8,64,256", help="comma list of concurrencies")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    parser.add_argument("--out", type=Path, default=HERE / "figures")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.streams.split(",")]
    # one request lasts ~110 ms (mean scripted TTFT) + 15 gaps of ~12.5 ms: offset first requests
    # by up to one request length so streams do not start in lockstep (both clients alike)
    jitter_s = 0.3
    rows = []
    started = datetime.now(UTC)
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="quantload-accuracy-") as tmp:
        folder = Path(tmp)
        for seed, streams in enumerate(levels):
            requests = max(streams, int(REQUESTS.get(streams, 4 * streams) * args.scale))
            result: dict[str, Any] = {"streams": streams, "requests": requests}
            for side in ("floor", "quantload"):
                server = FakeServerProcess(folder, seed * 2 + (side == "quantload"))
                try:
                    runner = run_floor if side == "floor" else run_quantload
                    result[side] = runner(server.url, streams, requests, jitter_s, folder)
                finally:
                    server.stop()
            rows.append(result)
            print(f"{streams} streams done", file=sys.stderr)
    text = table(rows)
    header = (
        f"quantload accuracy benchmark, {started:%Y-%m-%d %H:%M} UTC; fake server TTFT {TTFT_MS} ms,"
        f" ITL {ITL_MS} ms, {TOKENS} tokens; load average before {load_before[0]:.2f},"
        f" after {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)"
    )
    print(header)
    print(text)
    args.out.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    (args.out / f"accuracy-{stamp}.md").write_text(header + "\n\n" + text + "\n")
    raw = [
        {
            "streams": r["streams"],
            "requests": r["requests"],
            **{
                side: {k: v for k, v in r[side].items() if k not in ("ttft", "itl", "late")}
                | {
                    "ttft_err_ms": {q: percentile(r[side]["ttft"], q) for q in (50, 90, 99)},
                    "ttft_err_min_ms": min(r[side]["ttft"]) if r[side]["ttft"] else None,
                    "itl_err_ms": {q: percentile(r[side]["itl"], q) for q in (50, 99)},
                    "server_late_ms": {q: percentile(r[side]["late"], q) for q in (50, 99)},
                }
                for side in ("floor", "quantload")
            },
        }
        for r in rows
    ]
    (args.out / f"accuracy-{stamp}.json").write_text(json.dumps({"header": header, "rows": raw}, indent=2))
    print(f"written to {args.out}/accuracy-{stamp}.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
