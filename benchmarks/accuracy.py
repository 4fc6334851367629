"""How accurately quantload's Locust client measures streams, against the floor, on this machine.

For each concurrency (1, 8, 64, 256 by default) it starts the fake server (scripted TTFT 20-200 ms,
inter-token gaps 5-20 ms, 16 tokens, pathological chunks on) in a process of its own, runs the
raw-asyncio floor client, restarts the server, runs quantload's own load path (a one-stage
closed-loop plan through `quantload.load.supervisor.run_plan`, i.e. real Locust processes with the
production user class) once per `--workers` value, and judges every request exactly:
error = measured minus the scripted value the server reports in `timings`; "own" error also takes
out what the fake itself added (its delay in reading the request and in sending the first token,
which it reports), i.e. the client's own delay in reading and stamping the answer. It prints
one table and writes it, with the raw numbers, under benchmarks/figures/.

    .venv/bin/python benchmarks/accuracy.py                          # about 1-2 minutes
    .venv/bin/python benchmarks/accuracy.py --streams 8,64 --scale 0.5 --workers auto,2

Goals (issue 17): TTFT error p99 at most 5 ms at 64 and at 256 streams; `--workers` (auto, the
default) never worse than one process; no error below zero; delivered concurrency equal to the
asked one. Client CPU is printed per 100 streams, in % of one core, beside the floor's, with the
stage line's event-loop lag p99, its busiest process's CPU and what it said of its own figures
(issue 25: client_trust ok, degraded or saturated). Run it on a quiet machine: client and server
share the cores, so anything else running shows up as error.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quantload.config import LoadSettings, Settings
from quantload.experiments.sweep import sweep_plan
from quantload.load.calibrate import fake_delay_s
from quantload.load.fakeserver import FakeScript, FakeServerProcess
from quantload.load.processes import WorkersSetting, choose_workers, usable_cores
from quantload.load.prompts import Prompt
from quantload.load.records import iter_records, iter_stage_events
from quantload.load.summary import delivered_concurrency
from quantload.load.supervisor import run_plan
from quantload.load.workloads import StageRequests
from quantload.run_context import RunContext
from quantload.rundir.handle import RunDir
from quantload.served import ServedTarget
from quantload.stats import percentile

HERE = Path(__file__).resolve().parent
REQUESTS = {1: 60, 8: 300, 64: 500, 256: 1000}
TOKENS = 16
SCRIPT = FakeScript(ttft_ms=(20.0, 200.0), itl_ms=(5.0, 20.0), tokens=TOKENS)


# The per-request lists (ms) a side's summary carries, kept out of the raw JSON as lists.
PER_REQUEST = ("ttft", "own", "itl", "late", "read")


def errors_of(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """TTFT errors (against the script, and the client's own), ITL errors, intervals, the fake's
    lateness in sending the first token and its delay in reading the request (ms)."""
    found: dict[str, list[Any]] = {key: [] for key in (*PER_REQUEST, "intervals")}
    for row in rows:
        timings = row.get("timings") or {}
        times = row.get("content_times_s") or []
        if row.get("ttft_s") is None or "prompt_ms" not in timings:
            continue
        error = row["ttft_s"] * 1000 - timings["prompt_ms"]
        found["ttft"].append(error)
        fake_ms = fake_delay_s(row["sent_unix_s"], timings) * 1000
        late_ms = timings.get("first_token_late_ms", 0.0)
        found["own"].append(error - fake_ms)
        found["late"].append(late_ms)
        found["read"].append(fake_ms - late_ms)
        gap_ms = timings.get("predicted_per_token_ms")
        if gap_ms is not None:
            found["itl"] += [(b - a) * 1000 - gap_ms for a, b in itertools.pairwise(times)]
        found["intervals"].append((row["sent_unix_s"], row["sent_unix_s"] + row["e2e_s"]))
    return found


def _summary(
    found: dict[str, list[Any]], streams: int, requests: int, cpu_frac: float | None
) -> dict[str, Any]:
    return {
        **{key: found[key] for key in PER_REQUEST},
        "concurrency": delivered_concurrency(found["intervals"], streams),
        "cpu_frac": cpu_frac,
        "cpu_per_100_streams": None if cpu_frac is None else cpu_frac * 100 / streams,
        "ok": len(found["ttft"]),
        "requests": requests,
    }


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
    return _summary(errors_of(data["records"]), streams, requests, data["cpu_s"] / data["wall_s"])


def run_quantload(
    url: str, streams: int, requests: int, jitter_s: float, folder: Path, workers: WorkersSetting
) -> dict[str, Any]:
    run_dir = folder / f"quantload-{streams}-{len(list(folder.glob('quantload-*')))}"
    settings = LoadSettings(
        users=(streams,), repeats=1, warmup_requests=0, max_tokens=TOKENS, request_timeout_s=60,
        first_round_jitter_s=jitter_s, metrics_port=0, max_consecutive_errors=50, workers=workers,
    )  # fmt: skip
    drawn = StageRequests.of_prompts([Prompt(f"b{i}", f"benchmark request {i}", 4) for i in range(requests)])
    target = ServedTarget(name="fake", quant="none", model="fake", url=url)
    plan = sweep_plan(settings, target, drawn, "accuracy", f"acc{streams}")
    run_plan(plan, RunContext(RunDir(run_dir), "accuracy", Settings(load=settings)))
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
    end = ends[0] if ends else None
    summary = _summary(errors_of(rows), streams, requests, end.client_cpu_total_frac if end else None)
    summary["saturated"] = end.client_saturated if end else None
    lag_s = end.loop_lag_p99_s if end is not None else None
    summary["loop_lag_p99_ms"] = None if lag_s is None else lag_s * 1000
    summary["busiest_cpu_frac"] = end.client_cpu_frac if end else None
    summary["trust"] = end.client_trust if end else None
    summary["trust_why"] = end.client_trust_why if end else None
    summary["workers"] = choose_workers(workers, streams, usable_cores()).workers
    return summary


def fmt(values: list[float]) -> str:
    if not values:
        return "-"
    p50, p99 = percentile(values, 50) or 0.0, percentile(values, 99) or 0.0
    return f"{p50:.1f} / {p99:.1f} / {min(values):.1f}"


def _p(values: list[float], q: float) -> str:
    found = percentile(values, q)
    return "-" if found is None else f"{found:.1f}"


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| streams | client | TTFT err p50/p99/min ms | own TTFT err p99 ms | ITL err p50/p99 ms |"
        " delivered | client CPU % of a core per 100 streams | server late p99 ms | server read p99 ms | ok |"
        " loop lag p99 ms | busiest process CPU % | client flag |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        for side in row["sides"]:
            found = row[side]
            cpu = found["cpu_per_100_streams"]
            conc = found["concurrency"]
            lines.append(
                f"| {row['streams']} | {side} | {fmt(found['ttft'])} | {_p(found['own'], 99)} |"
                f" {_p(found['itl'], 50)} / {_p(found['itl'], 99)} |"
                f" {'-' if conc is None else f'{conc:.1f}'} | {'-' if cpu is None else f'{100 * cpu:.0f}'} |"
                f" {_p(found['late'], 99)} | {_p(found['read'], 99)} | {found['ok']}/{found['requests']} |"
                f" {_opt(found.get('loop_lag_p99_ms'), 1)} | {_opt(found.get('busiest_cpu_frac'), 0, 100)} |"
                f" {_flag(found)} |"
            )
    return "\n".join(lines)


def _opt(value: float | None, digits: int, scale: float = 1.0) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def _flag(found: dict[str, Any]) -> str:
    """What the stage line said of the client (its client_trust: ok, degraded, saturated; a line
    from before it: saturated or none); '-' for the floor."""
    if "saturated" not in found:
        return "-"
    if found.get("trust"):
        return str(found["trust"])
    return "saturated" if found["saturated"] else "none"


def _workers(text: str) -> list[WorkersSetting]:
    found: list[WorkersSetting] = []
    for part in text.split(","):
        if part:
            found.append("auto" if part == "auto" else int(part))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--streams", default="1,8,64,256", help="comma list of concurrencies")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply request counts")
    parser.add_argument("--workers", default="auto", help="comma list: auto, 0 (one process), N")
    parser.add_argument("--no-floor", action="store_true", help="skip the floor client")
    parser.add_argument("--out", type=Path, default=HERE / "figures")
    args = parser.parse_args(argv)
    levels = [int(x) for x in args.streams.split(",")]
    worker_settings = _workers(args.workers)
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
            result: dict[str, Any] = {"streams": streams, "requests": requests, "sides": []}
            runs: list[WorkersSetting | None] = [] if args.no_floor else [None]
            runs += worker_settings
            for index, workers in enumerate(runs):
                script = dataclasses.replace(SCRIPT, seed=seed * 10 + index)
                with FakeServerProcess(script) as server:
                    if workers is None:
                        side, found = "floor", run_floor(server.url, streams, requests, jitter_s, folder)
                    else:
                        found = run_quantload(server.url, streams, requests, jitter_s, folder, workers)
                        chosen = found["workers"]
                        side = f"quantload, {f'{chosen} worker(s)' if chosen else 'one process'} ({workers})"
                result[side] = found
                result["sides"].append(side)
            rows.append(result)
            print(f"{streams} streams done", file=sys.stderr)
    text = table(rows)
    header = (
        f"quantload accuracy benchmark, {started:%Y-%m-%d %H:%M} UTC; fake server TTFT"
        f" {SCRIPT.ttft_ms[0]:g}-{SCRIPT.ttft_ms[1]:g} ms, ITL {SCRIPT.itl_ms[0]:g}-{SCRIPT.itl_ms[1]:g} ms,"
        f" {TOKENS} tokens, keep-alive; load average before {load_before[0]:.2f},"
        f" after {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores). TTFT err: measured minus scripted;"
        " own: minus also the fake's own delays (server read: from the client's send to the fake having"
        " read the request; server late: its lateness in sending the first token)."
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
                side: {k: v for k, v in r[side].items() if k not in PER_REQUEST}
                | {
                    "ttft_err_ms": {q: percentile(r[side]["ttft"], q) for q in (50, 90, 99)},
                    "ttft_own_err_ms": {q: percentile(r[side]["own"], q) for q in (50, 90, 99)},
                    "ttft_err_min_ms": min(r[side]["ttft"]) if r[side]["ttft"] else None,
                    "itl_err_ms": {q: percentile(r[side]["itl"], q) for q in (50, 99)},
                    "server_late_ms": {q: percentile(r[side]["late"], q) for q in (50, 99)},
                    "server_read_ms": {q: percentile(r[side]["read"], q) for q in (50, 99)},
                }
                for side in r["sides"]
            },
        }
        for r in rows
    ]
    (args.out / f"accuracy-{stamp}.json").write_text(json.dumps({"header": header, "rows": raw}, indent=2))
    print(f"written to {args.out}/accuracy-{stamp}.md", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
