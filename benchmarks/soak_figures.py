"""The soak's figures (issue 25): one load held on one quantization for a long time, and its drift.

Prepares the quantization (`quantload prepare`, cached) and runs `quantload run --files` of that
file alone with only the soak experiment (or reads a finished run directory with `--from`), and
prints: how long the load was held and at what level, the machine's load average before, during
(every minute) and after, and the share of the CPUs other processes used meanwhile; requests and
errors; the drift per hour of TTFT p99 and of the server's and the load client's resident memory,
each with its standard error, 95 % interval and verdict, and the first and last slices' values.
Written under benchmarks/figures/ too (no machine paths).

    nice -n 10 .venv/bin/python benchmarks/soak_figures.py --model smollm2-135m --quant Q4_K_M \
        --users 4 --duration 1h                                   # the measured target: an hour
    .venv/bin/python benchmarks/soak_figures.py --from results/RUN_ID

The run's quality step is skipped (no dataset is given) and its speed step is the quick profile's
short llama-bench; what is measured is the soak.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quantload.cpu_share import mark, other_cpu_frac
from quantload.models.prepared import prepared_folder
from quantload.paths import cache_root

HERE = Path(__file__).resolve().parent
MIB = 2.0**20


def prepared_file(model: str, quant: str) -> Path:
    """The model's `quant` file, made (or found) in the cache folder every run of the model
    shares: `quantload prepare` makes the reference too, and the run then serves this file alone
    (given with --files, as a user's own file)."""
    folder = prepared_folder(cache_root(None, os.environ), model)
    command = [
        sys.executable, "-m", "quantload.cli.main", "prepare", "--model", model, "--out", str(folder),
        "--quants", quant,
    ]  # fmt: skip
    subprocess.run(command, check=True)
    manifest = json.loads((folder / "manifest.json").read_text(encoding="utf-8"))
    return folder / manifest["files"][quant]["file"]


def run(model: str, quant: str, users: int, duration: str, slice_s: float, out: Path) -> dict[str, Any]:
    """`quantload run` of the soak alone on one file; the run directory, wall time and the machine
    meanwhile."""
    command = [
        sys.executable, "-m", "quantload.cli.main", "run", "--files", str(prepared_file(model, quant)),
        "--profile", "quick", "--duration", duration, "--out", str(out),
    ]  # fmt: skip
    env = {
        **os.environ,
        "QUANTLOAD_LOAD__EXPERIMENTS": "soak",
        "QUANTLOAD_SOAK__USERS": str(users),
        "QUANTLOAD_SOAK__SLICE_S": str(slice_s),
    }
    loads: list[float] = []
    since, started = mark(), time.monotonic()
    before = os.getloadavg()[0]
    process = subprocess.Popen(command, env=env)
    while process.poll() is None:
        loads.append(os.getloadavg()[0])
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            continue
    if process.returncode != 0:
        print(f"quantload run exited {process.returncode}; reading what it wrote", file=sys.stderr)
    run_dir = max((p for p in out.iterdir() if (p / "run.json").is_file()), key=lambda p: p.stat().st_mtime)
    return {
        "run_dir": run_dir,
        "wall_s": time.monotonic() - started,
        "other_cpu_frac": other_cpu_frac(since),
        "load_before": before,
        "load_during": loads,
        "load_after": os.getloadavg()[0],
    }


def _ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:+.2f} ms"


def _mib(value: float | None) -> str:
    return "–" if value is None else f"{value / MIB:+.2f} MiB"


MACHINE_JSON = "soak-benchmark-machine.json"  # what the machine did meanwhile, kept in the run dir


def drift_line(drift: dict[str, Any]) -> str:
    show = _ms if drift["what"] == "TTFT p99" else _mib
    head = f"| {drift['what']} | {drift['part']} |"
    if drift["slope_per_h"] is None:
        return f"{head} – | – | – | {drift['points']} slices: too few |"
    verdict = "beyond noise" if drift["beyond_noise"] else "within noise"
    return (
        f"{head} {show(drift['slope_per_h'])}/h | {show(drift['stderr_per_h']).lstrip('+')}/h |"
        f" {show(drift['ci_low_per_h'])} to {show(drift['ci_high_per_h'])} | {drift['points']} slices,"
        f" p = {drift['p_value']:.3g}: {verdict} |"
    )


def slice_lines(slices: list[dict[str, Any]]) -> list[str]:
    def cell(value: Any, scale: float, digits: int) -> str:
        return "–" if value is None else f"{value * scale:,.{digits}f}"

    lines = [
        "| slice | requests | failed | TTFT p50 ms | TTFT p99 ms | TPOT p50 ms | server MiB | client MiB |"
        " KV cells (median) | loop lag p99 ms |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in slices:
        lines.append(
            f"| {s['slice']} | {s['requests']} | {s['failed']} | {cell(s['ttft_p50_s'], 1000, 0)} |"
            f" {cell(s['ttft_p99_s'], 1000, 0)} | {cell(s['tpot_p50_s'], 1000, 0)} |"
            f" {cell(s['server_rss_bytes'], 1 / MIB, 1)} | {cell(s['client_rss_bytes'], 1 / MIB, 2)} |"
            f" {cell(s['kv_cells_used'], 1, 0)} | {cell(s['loop_lag_p99_s'], 1000, 1)} |"
        )
    return lines


def _both(ends: tuple[dict[str, Any], dict[str, Any]], key: str, show: Any) -> str:
    first, last = ends[0].get(key), ends[1].get(key)
    return f"{show(first) if first is not None else '–'} -> {show(last) if last is not None else '–'}"


def figures(run_dir: Path, machine: dict[str, Any] | None) -> str:
    summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
    lines = []
    for soak in summary["soak"]:
        slices = soak["slices"]
        requests = sum(s["requests"] or 0 for s in slices)
        failed = sum(s["failed"] or 0 for s in slices)
        errors = sorted({s["errors"] for s in slices if s["errors"]})
        held = soak["held_s"] or 0.0
        lines.append(
            f"Soak of {soak['quant']} at {soak['level']} ({soak['level_from']}): held {held / 60:.1f} min"
            f" ({held:.0f} s; {soak['duration_s']:.0f} s asked) in {len(slices)} slices of"
            f" {soak['slice_s']:.0f} s, the first {soak['settle_slices']} left out of the fits."
            f" {requests:,} requests, {failed:,} failed ({', '.join(errors) or 'no errors'})."
            f" Server memory from {soak['memory_source'] or 'nowhere: ' + str(soak['memory_missing'])}."
        )
        lines += [
            "",
            "| drift | slices fitted | slope | standard error | 95 % interval | verdict |",
            "|---|---|---|---|---|---|",
        ]
        lines += [drift_line(d) for d in soak["drift"]]
        lines += ["", *slice_lines(slices)]
        ends = (slices[0], slices[-1])
        lines += [
            "",
            f"First and last slice: TTFT p99 {_both(ends, 'ttft_p99_s', lambda v: f'{v * 1000:.0f} ms')};"
            f" server memory {_both(ends, 'server_rss_bytes', lambda v: f'{v / MIB:.1f} MiB')};"
            f" load client memory {_both(ends, 'client_rss_bytes', lambda v: f'{v / MIB:.1f} MiB')};"
            f" KV cells in use {_both(ends, 'kv_cells_used', lambda v: f'{v:.0f}')}.",
        ]
    if machine is not None:
        during = machine["load_during"]
        mean = sum(during) / len(during) if during else None
        other = machine["other_cpu_frac"]
        lines += [
            "",
            f"Machine: {os.cpu_count()} cores; load average before {machine['load_before']:.2f}, during"
            f" {'–' if mean is None else f'{mean:.2f}'} on average (max {max(during, default=0.0):.2f},"
            f" {len(during)} samples a minute apart), after {machine['load_after']:.2f}; other processes"
            f" used {'–' if other is None else f'{other:.0%}'} of the CPUs; the whole run took"
            f" {machine['wall_s'] / 60:.1f} min.",
        ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--quant", default="Q4_K_M")
    parser.add_argument("--users", type=int, default=4)
    parser.add_argument("--duration", default="1h")
    parser.add_argument("--slice-s", type=float, default=60.0)
    parser.add_argument("--out", type=Path, default=Path("results"))
    parser.add_argument("--from", dest="run_dir", type=Path, help="a finished run directory")
    parser.add_argument("--figures", type=Path, default=HERE / "figures")
    args = parser.parse_args(argv)
    started = datetime.now(UTC)
    machine = None
    if args.run_dir is None:
        machine = run(args.model, args.quant, args.users, args.duration, args.slice_s, args.out)
        run_dir = machine.pop("run_dir")
        (run_dir / MACHINE_JSON).write_text(json.dumps(machine, indent=2) + "\n", encoding="utf-8")
    else:
        run_dir = args.run_dir
        kept = run_dir / MACHINE_JSON
        machine = json.loads(kept.read_text(encoding="utf-8")) if kept.is_file() else None
    text = figures(run_dir, machine)
    header = f"quantload soak, {started:%Y-%m-%d %H:%M} UTC, run {run_dir.name}"
    print(header)
    print(text)
    args.figures.mkdir(parents=True, exist_ok=True)
    path = args.figures / f"soak-{args.model}-{started:%Y%m%dT%H%MZ}.md"
    path.write_text(header + "\n\n" + text + "\n", encoding="utf-8")
    print(f"written to {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
