"""Traffic like production on a real model, and the limit the search finds (issue 14).

Part 1 runs `quantload run --model MODEL --profile quick` with the traffic experiments switched on
through environment settings a user could set the same way (QUANTLOAD_<SECTION>__<KEY>):
the 1, 2, 4, 8 sweep, 4-turn conversations with the prompt cache off and on, the mixed-traffic
diagnosis at two llama-server batch sizes, and both limit searches. It prints the run's wall time
and each step's, other processes' CPU share meanwhile, then from summary.json: TTFT and prompt
tokens by turn, the mixed-traffic table (decode ITL p95/p99 alone and with long prompts, per
batch size), and per quantization the limits found, their search time and what the sweep alone says.

Part 2 (`--affinity`) asks which placement keeps a conversation's cache: one llama-server of the
run's Q8_0 file with fewer slots than conversations in flight, `quantload load -e sessions` with
`sessions.affinity` none (llama-server's slot similarity, -sps) and then id_slot; prints each
conversation's prefix-cache hit rate (timings.cache_n) and TTFT by turn for both.

Everything printed is also written under benchmarks/figures/ (file names only, no machine paths).

    .venv/bin/python benchmarks/traffic_figures.py --affinity     # about 25 minutes on 2 cores
    .venv/bin/python benchmarks/traffic_figures.py --from results/RUN_ID --affinity
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from kv_types_figures import step_lines

from quantload.cpu_share import mark, other_cpu_frac

HERE = Path(__file__).resolve().parent
DEFAULT_TEXT = HERE.parent.parent / "shared" / "data" / "wikitext-2-raw" / "wiki.test.raw"

# The quick profile with the traffic experiments on, sized for a 2-core machine.
TRAFFIC_ENV: dict[str, str] = {
    "QUANTLOAD_LOAD__EXPERIMENTS": "sweep,sessions,mixed,limit_users,limit_rate",
    "QUANTLOAD_SESSIONS__USERS": "2",
    "QUANTLOAD_SESSIONS__COUNT": "4",
    "QUANTLOAD_SESSIONS__TURNS": "4",
    "QUANTLOAD_SESSIONS__THINK_TIME_S": "0.5",
    "QUANTLOAD_SESSIONS__REPLY_TOKENS": "fixed:48",
    "QUANTLOAD_MIXED__USERS": "4",
    "QUANTLOAD_MIXED__DECODE_REQUESTS": "8",
    "QUANTLOAD_MIXED__DECODE_OUTPUT_TOKENS": "64",
    "QUANTLOAD_MIXED__LONG_FRACTION": "0.25",
    "QUANTLOAD_LIMIT__START_RATE_RPS": "0.25",
    "QUANTLOAD_LIMIT__MAX_RATE_RPS": "8",
    "QUANTLOAD_LIMIT__TRIAL_SECONDS": "12",
}


# Part 2: 4 conversations in flight over fewer slots, 8 per stage, 4 turns, the cache on.
AFFINITY_ENV: dict[str, str] = {
    "QUANTLOAD_SESSIONS__USERS": "4",
    "QUANTLOAD_SESSIONS__COUNT": "8",
    "QUANTLOAD_SESSIONS__TURNS": "4",
    "QUANTLOAD_SESSIONS__THINK_TIME_S": "0.5",
    "QUANTLOAD_SESSIONS__REPLY_TOKENS": "fixed:32",
    "QUANTLOAD_SESSIONS__CACHE_MODES": "[true]",
}


def _ms(value: Any) -> str:
    return "–" if value is None else f"{value * 1000:,.0f}"


def _number(value: Any, digits: int = 1) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def quantload(args: list[str], env: dict[str, str]) -> None:
    subprocess.run([sys.executable, "-m", "quantload.cli.main", *args], check=True, env=env)


def traffic_run(model: str, dataset: Path, out: Path) -> tuple[Path, float, float | None]:
    """The traffic run into `out`: its run directory, wall time and other processes' CPU share."""
    env = {**os.environ, **TRAFFIC_ENV}
    since, started = mark(), time.monotonic()
    args = ["run", "--model", model, "--profile", "quick", "--dataset", str(dataset), "--out", str(out)]
    quantload(args, env)
    wall_s, others = time.monotonic() - started, other_cpu_frac(since)
    (run_dir,) = [p for p in out.iterdir() if p.is_dir()]
    return run_dir, wall_s, others


def turn_lines(rows: list[dict[str, Any]], title: str) -> list[str]:
    header = (
        "| quant | cache_prompt | turn | ok | prompt tokens p50 | cached share | TTFT p50 ms | TTFT p99 ms |"
    )
    lines = [title, "", header,
             "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in rows:
        share = "–" if r.get("cache_hit_frac") is None else f"{r['cache_hit_frac']:.0%}"
        lines.append(
            f"| {r['quant']} | {'on' if r['cache_prompt'] else 'off'} | {r['turn'] + 1}"
            f" | {r['ok']}/{r['requests']}"
            f" | {_number(r.get('prompt_tokens_p50'), 0)} | {share} | {_ms(r.get('ttft_p50_s'))}"
            f" | {_ms(r.get('ttft_p99_s'))} |"
        )
    return lines


def hit_lines(rows: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| quant | cache_prompt | "
        + " | ".join(k for k in rows[0] if k not in ("quant", "cache_prompt"))
        + " |"
    ]
    lines.append("|" + "---|" * (len(rows[0])))
    for r in rows:
        cells = [str(r["quant"]), "on" if r["cache_prompt"] else "off"]
        cells += [
            _number(v, 3) if isinstance(v, float) else str(v)
            for k, v in r.items()
            if k not in ("quant", "cache_prompt")
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def mixed_lines(rows: list[dict[str, Any]], verdict: str) -> list[str]:
    wanted = ("itl_p50_s", "itl_p95_s", "itl_p99_s", "tpot_p50_s", "decode_ttft_p50_s", "long_ttft_p50_s")
    present = [k for k in wanted if any(k in r for r in rows)]
    columns = " | ".join(f"{k[:-2]} ms" for k in present)
    lines = ["| quant | -b/-ub | phase | decode / long requests | " + columns + " |",
             "|---|---|---|---:|" + "---:|" * len(present)]  # fmt: skip
    for r in rows:
        cells = [r["quant"], str(r.get("server_args") or "as served"), r["phase"],
                 f"{r.get('decode_requests')} / {r.get('long_requests')}"]  # fmt: skip
        cells += [_ms(r.get(k)) for k in present]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, "", f"verdict: {verdict}"]


def limit_lines(summary: dict[str, Any]) -> list[str]:
    lines = ["| quant | search | limit | misses from | ending | trials | search s | the sweep alone |",
             "|---|---|---:|---|---|---:|---:|---|"]  # fmt: skip
    sweep = {
        v["quant"]: v.get("sweep_sentence") or v.get("sentence", "") for v in summary.get("capacity", [])
    }
    for line in summary.get("limits", []):
        missed = line.get("lowest_miss", line.get("lowest_broken"))
        lines.append(
            f"| {line['quant']} | {line['kind']} | {_number(line['limit'], 2)} | {_number(missed, 2)}"
            f" | {line['ending']} | {len(line['trials'])} | {line['seconds']:.0f}"
            f" | {sweep.get(line['quant'], '')} |"
        )
    lines.append("")
    lines += [f"- {line['quant']} {line['kind']}: {line['sentence']}" for line in summary.get("limits", [])]
    return lines


def part_one(run_dir: Path, wall_s: float | None, others: float | None) -> list[str]:
    state = json.loads((run_dir / "run.json").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    lines = [
        f"# Traffic figures: run {state.get('run_id', run_dir.name)}",
        "",
    ]
    if wall_s is not None:
        share = "not measured" if others is None else f"{others:.0%}"
        lines += [
            f"wall time of `quantload run` (report included): {wall_s:.0f} s;"
            f" other processes' CPU share: {share}",
            "",
        ]
    lines += [
        "settings on top of the quick profile:",
        "",
        *(f"    {k}={v}" for k, v in TRAFFIC_ENV.items()),
        "",
    ]
    lines += [*step_lines(state), ""]
    lines += turn_lines(
        summary.get("session_turns", []), "## TTFT and prompt tokens by turn (4-turn conversations)"
    )
    if summary.get("session_hits"):
        lines += ["", "per-conversation prefix-cache hit rate:", "", *hit_lines(summary["session_hits"])]
    lines += [
        "",
        "## Mixed traffic",
        "",
        *mixed_lines(summary.get("mixed", []), summary.get("mixed_verdict", "")),
    ]
    lines += ["", "## The limit search beside the sweep", "", *limit_lines(summary)]
    return lines


def q8_file(run_dir: Path) -> Path:
    """The run's prepared Q8_0 file, from its manifest.json."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    entry = manifest["files"]["Q8_0"]
    path = Path(entry["path"])
    return path if path.is_file() else run_dir / entry["file"]


def part_two(run_dir: Path, slots: int) -> list[str]:
    """Slot similarity (-sps) against id_slot pinning, fewer slots than conversations in flight."""
    from quantload.config import load_config
    from quantload.llamacpp.server import LlamaServer, ServerSpec, free_port
    from quantload.llamacpp.toolchain import ensure_toolchain

    model = q8_file(run_dir)
    lines = [
        "",
        f"## Which placement keeps a conversation's cache ({slots} slots, 4 conversations in flight)",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="ql-affinity-") as tmp:
        spec = ServerSpec(
            model_path=model, alias="affinity-q8_0", port=free_port(), slots=slots, ctx_per_slot=4096
        )
        toolchain = ensure_toolchain(load_config(Path.cwd(), os.environ, {}).settings.toolchain, os.environ)
        server = LlamaServer(toolchain, spec, Path(tmp) / "server.log", 120.0)
        server.start()
        try:
            for affinity in ("none", "id_slot"):
                out = Path(tmp) / affinity
                env = {**os.environ, **AFFINITY_ENV, "QUANTLOAD_SESSIONS__AFFINITY": affinity}
                quantload(
                    ["load", "--url", server.url, "--quant", "Q8_0", "-e", "sessions", "--out", str(out)], env
                )
                quantload(["report", str(out)], env)
                summary = json.loads((out / "summary.json").read_text())
                hits = summary.get("session_hits", [])
                lines += [
                    f"### affinity = {affinity}",
                    "",
                    *(hit_lines(hits) if hits else ["no conversations"]),
                    "",
                ]
                turns = summary.get("session_turns", [])
                lines += [*turn_lines(turns, "TTFT by turn:"), ""]
        finally:
            server.stop()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dataset", type=Path, default=DEFAULT_TEXT)
    parser.add_argument("--from", dest="run_dir", type=Path, help="a finished traffic run directory")
    parser.add_argument("--affinity", action="store_true", help="also part 2: -sps against id_slot")
    parser.add_argument("--slots", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ql-traffic-") as tmp:
        if args.run_dir is None:
            run_dir, wall_s, others = traffic_run(args.model, args.dataset, Path(tmp))
        else:
            run_dir, wall_s, others = args.run_dir, None, None
        lines = part_one(run_dir, wall_s, others)
        if args.affinity:
            lines += part_two(run_dir, args.slots)
        text = "\n".join(lines) + "\n"
        print(text)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%MZ")
        figure = HERE / "figures" / f"traffic-{args.model}-{stamp}.md"
        figure.write_text(text)
        print(f"written: benchmarks/figures/{figure.name}")
        if args.run_dir is None:
            kept = HERE.parent / "results" / "traffic" / run_dir.name
            kept.parent.mkdir(parents=True, exist_ok=True)
            subprocess.run(["cp", "-r", str(run_dir), str(kept)], check=True)
            print(f"run kept: results/traffic/{run_dir.name}")


if __name__ == "__main__":
    main()
