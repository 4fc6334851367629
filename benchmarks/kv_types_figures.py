"""The KV-cache type trade-off of one `quantload run`, and what the run's steps cost (issue 13).

Runs `quantload run --model MODEL --profile PROFILE` (or reads a finished run directory with
`--from`) and prints: the run's wall time and each step's (summed per step name: kld and kv_types
are what issue 13 adds), the load average before and after and the share of the CPUs other
processes used meanwhile; the KV-cache type table (per quantization and cache type: exact KV MiB
and what the server reported, output tok/s of the decode-heavy stage at the experiment's users,
TPOT p50, mean KLD from F16); then the report's new sections as text (the verdict at the quality
limit, the quality loss against F16, the trade-off). The whole is also written under
benchmarks/figures/ (file names only, no machine paths).

    .venv/bin/python benchmarks/kv_types_figures.py --model smollm2-135m --profile quick \
        --dataset ../shared/data/wikitext-2-raw/wiki.test.raw        # the quick run: minutes
    .venv/bin/python benchmarks/kv_types_figures.py --from results/RUN_ID
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quantload.cpu_share import mark, other_cpu_frac

HERE = Path(__file__).resolve().parent
DEFAULT_TEXT = HERE.parent.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"
SECTIONS = ("Quality loss against F16 (KL divergence)", "KV-cache type trade-off")


def run(model: str, profile: str, dataset: Path, out: Path) -> tuple[Path, float, float | None]:
    """`quantload run` into `out`: its run directory, wall time and other processes' CPU share."""
    command = [
        sys.executable, "-m", "quantload.cli.main", "run", "--model", model, "--profile", profile,
        "--dataset", str(dataset), "--out", str(out),
    ]  # fmt: skip
    since, started = mark(), time.monotonic()
    subprocess.run(command, check=True)
    wall_s, others = time.monotonic() - started, other_cpu_frac(since)
    run_dir = max((p for p in out.iterdir() if (p / "run.json").is_file()), key=lambda p: p.stat().st_mtime)
    return run_dir, wall_s, others


def _number(value: Any, digits: int, unit: str = "") -> str:
    if value is None:
        return "–"
    return f"{value:,.{digits}f}{unit}"


def step_lines(state: dict[str, Any]) -> list[str]:
    """The run's wall time and each step name's summed wall time, longest first."""
    per_step: dict[str, float] = defaultdict(float)
    for step in state["steps"]:
        if step.get("finished_unix_s") and step.get("started_unix_s"):
            per_step[step["name"]] += step["finished_unix_s"] - step["started_unix_s"]
    total = (state.get("finished_unix_s") or 0) - state["started_unix_s"]
    lines = [f"run wall time (run.json, start to finish, report not included): {total:.0f} s", ""]
    lines += ["| step | seconds (all quantizations) | share of the run |", "|---|---:|---:|"]
    for name, seconds in sorted(per_step.items(), key=lambda item: -item[1]):
        lines.append(f"| {name} | {seconds:.1f} | {seconds / total:.0%} |")
    return lines


def trade_off_lines(summary: dict[str, Any]) -> list[str]:
    """The KV-cache type table as summary.json holds it."""
    rows = summary["kv_cache_types"]
    users = sorted({int(r["users"]) for r in rows if r["users"] is not None})
    at = f"{users[0]} users" if len(users) == 1 else "its users"
    lines = [
        f"| quant | K/V cache | KV MiB (exact) | reported MiB | output tok/s @{at} | vs f16 | TPOT p50 |"
        " mean KLD ± s.e. (nats) | KLD added | same top % | flash attn |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        kld = _number(r["kld_mean_nats"], 6)
        if r["kld_mean_error_nats"] is not None:
            kld += f" ± {r['kld_mean_error_nats']:.6f}"
        vs = "–" if r["output_vs_f16_frac"] is None else f"{r['output_vs_f16_frac']:+.1%}"
        tpot = "–" if r["tpot_p50_s"] is None else f"{r['tpot_p50_s'] * 1000:.1f} ms"
        cells = [
            r["quant"], r["cache_type"] + (" (served)" if r["own_server"] else ""),
            _number(r["kv_predicted_mib"], 2), _number(r["kv_reported_mib"], 2),
            _number(r["output_tok_s"], 1), vs, tpot, kld, _number(r["kld_added_nats"], 6),
            _number(r["same_top_p_pct"], 2), r["flash_attn"] or "–",
        ]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return lines


def _section(lines: list[str], title: str) -> list[str]:
    start = lines.index(f"## {title}")
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    return [line for line in lines[start:end] if not line.startswith("![")]  # the plots stay behind


def report_sections(markdown: str) -> list[str]:
    """The capacity verdicts and the verdict at the quality limit, then the new sections of
    report.md, as the report writes them."""
    lines = markdown.splitlines()
    verdicts = [
        line for line in _section(lines, "Run and verdict")
        if line.startswith("**") or (line.startswith("- ") and "the SLO" in line)
    ]  # fmt: skip
    chosen = ["## Run and verdict (the verdict lines)", ""]
    for line in verdicts:
        chosen += ["", line] if line.startswith("**") else [line]
    for title in SECTIONS:
        chosen += ["", *_section(lines, title)]
    return chosen


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--profile", default="quick", choices=("quick", "full", "ci"))
    parser.add_argument("--dataset", type=Path, default=DEFAULT_TEXT)
    parser.add_argument("--from", dest="source", type=Path, help="a finished run directory; measure nothing")
    parser.add_argument("--label", help="names the figures (default: MODEL-PROFILE)")
    parser.add_argument("--out", type=Path, help="keep the run directory under this folder")
    args = parser.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        if args.source is not None:
            run_dir, wall_s, others = args.source, None, None
        else:
            out = args.out or Path(tmp)
            out.mkdir(parents=True, exist_ok=True)
            run_dir, wall_s, others = run(args.model, args.profile, args.dataset, out)
        state = json.loads((run_dir / "run.json").read_text(encoding="utf-8"))
        summary = json.loads((run_dir / "summary.json").read_text(encoding="utf-8"))
        markdown = (run_dir / "report.md").read_text(encoding="utf-8")
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%MZ")
    label = args.label or f"{args.model}-{args.profile}"
    when = (
        f"measured now: `quantload run` wall time {wall_s:.0f} s, report included; load average before"
        f" {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}; other processes used"
        f" {'?' if others is None else f'{others:.0%}'} of the CPUs meanwhile"
        if wall_s is not None
        else f"read from run {state['run_id']} (load average now {load_before[0]:.2f})"
    )
    lines = [f"# KV-cache type trade-off and run cost, {label}", "", f"{stamp}; {when}", ""]
    lines += [*step_lines(state), "", "## The KV-cache type table", "", *trade_off_lines(summary)]
    lines += ["", "## The report's new sections, as written", "", *report_sections(markdown)]
    print("\n".join(lines))
    figures = HERE / "figures"
    figures.mkdir(exist_ok=True)
    path = figures / f"kv-types-{label}-{stamp}.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"\nwritten to {path}")


if __name__ == "__main__":
    main()
