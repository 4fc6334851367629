"""Conversations beyond the slot and tenants sharing a server, on a real model (issue 23).

One llama-server of the model's Q4_K_M file (the run's own settings: 8 slots of 4,096 tokens, but
one thread: `-t 1`; on a 2-core machine that other processes keep busy, llama.cpp's two threads
wait on each other: SmolLM2 decoded 2.4 tokens/s with `-t 2` and 32 with `-t 1`, measured side by
side at a load average of 15), and through the run's own steps:

1. the context experiment: 20 conversations per policy (fail, trim, shift), 4 at once, on a variant
   with 4 slots of 1,024 tokens (restarted in place; shift with --context-shift --keep), llama-server
   placing each turn, and the experiment's defaults: a 128-token system prompt, user turns of 40-80
   tokens, 64-token replies, turns enough for the history to reach 1.5 slots;
2. a users limit search of tenant A's kind of request (the capacity plan's per-server limit, which
   sizes a server per tenant);
3. the noisy neighbour: tenant A at 2 users (128-token prompts, 16-token replies) while tenant B
   (512-token prompts, 16-token replies) steps 0, 2, 4, 8 users, 4 requests per user and step.

The SLO is TTFT p99 <= 5 s and TPOT p99 <= 500 ms: on this shared 2-core machine SmolLM2's TTFT at
2 users of 128-token prompts is about 2 s with no neighbour at all, so the default 1 s would say
only that A misses alone. Then the report (plan: 1 USD per server-hour, a 1 GiB memory budget), and
from its summary.json:
per policy the conversations completed of 20, the turn they were refused, trimmed or shifted, the
cache hit before and after, TTFT and prompt tokens by turn; the context a slot needs; A's TTFT p99
and goodput per B step, the fairness index, the B load where A breaks its SLO and what a server
per tenant would cost. The load average before and after and other processes' CPU share are
printed too: these figures come from a shared 2-core machine.

Everything printed is also written under benchmarks/figures/ (file names only, no machine paths).

    .venv/bin/python benchmarks/context_tenant_figures.py            # about 40 minutes on 2 busy cores
    .venv/bin/python benchmarks/context_tenant_figures.py --part tenants   # parts 2 and 3 only
    .venv/bin/python benchmarks/context_tenant_figures.py --from DIR # the tables of a finished run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quantload.cpu_share import mark, other_cpu_frac

HERE = Path(__file__).resolve().parent
QUANT = "Q4_K_M"
TOML = """
[model]
source = "{model}"

[server]
threads = 1

[load]
warmup_requests = 1
max_tokens = 16
metrics_port = 0

[workload]
kind = "lengths"
input_lengths = "fixed:128"
output_lengths = "fixed:16"

[slo]
ttft_s = 5.0
tpot_s = 0.5

[context]
conversations = 20
users = 4
slots = 4
ctx_per_slot = 1024

[limit]
max_users = 16
time_cap_s = 60.0
requests_per_user = 2
min_requests = 4

[[tenants]]
name = "A"
users = 2
workload = {{ kind = "lengths", input_lengths = "fixed:128", output_lengths = "fixed:16" }}

[[tenants]]
name = "B"
users = 2
workload = {{ kind = "lengths", input_lengths = "fixed:512", output_lengths = "fixed:16" }}

[noisy_neighbour]
neighbour = "B"
steps = [0, 2, 4, 8]
requests_per_user = 4
"""


def _ms(value: Any) -> str:
    return "–" if value is None else f"{value * 1000:,.0f}"


def _pct(value: Any) -> str:
    return "–" if value is None else f"{value:.0%}"


def _num(value: Any, digits: int = 2) -> str:
    return "–" if value is None else f"{value:,.{digits}f}"


def quantload(args: list[str], cwd: Path) -> None:
    subprocess.run([sys.executable, "-m", "quantload.cli.main", *args], check=True, cwd=cwd)


PARTS = {
    "all": ("context", "limit_users", "noisy_neighbour"),
    "context": ("context",),
    "tenants": ("limit_users", "noisy_neighbour"),
}


def measure(model: str, work: Path, experiments: tuple[str, ...]) -> tuple[Path, dict[str, float]]:
    """Prepare the model, start its server, run the three experiments, write the report."""
    from quantload.config import load_config
    from quantload.llamacpp.server import free_port
    from quantload.paths import cache_root
    from quantload.run_context import RunContext
    from quantload.rundir.handle import RunDir
    from quantload.served import server_name
    from quantload.stack.run_steps import RunSteps, Served

    (work / "quantload.toml").write_text(TOML.format(model=model), encoding="utf-8")
    settings = load_config(work, os.environ).settings
    models = work / "models"
    quantload(["prepare", "--model", model, "--out", str(models)], work)
    run_dir = work / "run"
    (run_dir / "logs").mkdir(parents=True)
    shutil.copy(models / "manifest.json", run_dir / "manifest.json")
    manifest = json.loads((run_dir / "manifest.json").read_text())
    (run_dir / "config.json").write_text(json.dumps({"settings": settings.model_dump(mode="json")}))
    steps = RunSteps(settings, os.environ, cache_root(None, os.environ))
    toolchain = steps.toolchain(lambda *_: None)
    seconds: dict[str, float] = {}
    server = steps.server(toolchain, models / manifest["files"][QUANT]["file"], f"m-{QUANT}", QUANT, run_dir)
    with server:
        steps.check_kv(toolchain, server, QUANT, run_dir)
        served = Served(QUANT, server, name=server_name(QUANT), model=model)
        variants = steps.server_variants(toolchain, served, run_dir, True)
        context = RunContext(
            RunDir(run_dir), "bench-context-tenants", settings, loadgen_port=free_port(), cwd=work
        )
        for experiment in experiments:
            started = time.monotonic()
            steps.experiment(experiment, served.load_target(), context, variants)
            seconds[experiment] = time.monotonic() - started
    quantload(
        ["report", str(run_dir), "--price-per-hour", "1", "--currency", "USD", "--memory-budget-gib", "1"],
        work,
    )
    return run_dir, seconds


def context_lines(summary: dict[str, Any]) -> list[str]:
    lines = [
        "## Per policy (20 conversations each, 1,024-token slots)",
        "",
        "| policy | completed | event turn (median, first–last) | refused turn p50 | llama-server's counts |"
        " truncated replies | cache hit before | cache hit after |",
        "|---|---:|---|---:|---|---:|---:|---:|",
    ]
    for r in summary["context_policies"]:
        event = "none"
        if r["event_turn_p50"] is not None:
            event = f"{r['event_turn_p50']:g} ({r['event_turn_min']:g}–{r['event_turn_max']:g})"
        counts = "–"
        if r["refused_prompt_tokens"] is not None:
            counts = f"{r['refused_prompt_tokens']:,.0f} of {r['refused_n_ctx']:,.0f}"
        lines.append(
            f"| {r['policy']} | {r['completed']} / {r['conversations']} | {event}"
            f" | {_num(r['refused_turn_p50'], 1)} | {counts} | {r['truncated_replies']}"
            f" | {_pct(r['hit_frac_before'])} | {_pct(r['hit_frac_after'])} |"
        )
    lines += [
        "",
        "## By turn (turn 0 = first)",
        "",
        "| policy | turn | ok / sent | refused | truncated | shifted | trimmed | TTFT p50 ms | TTFT p99 ms"
        " | prompt tokens p50 | cache hit |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in summary["context_turns"]:
        lines.append(
            f"| {r['policy']} | {r['turn']} | {r['ok']} / {r['requests']} | {r['refused']} | {r['truncated']}"
            f" | {r['shifted']} | {r['trimmed']} | {_ms(r['ttft_p50_s'])} | {_ms(r['ttft_p99_s'])}"
            f" | {_num(r['prompt_tokens_p50'], 0)} | {_pct(r['cache_hit_frac'])} |"
        )
    need = summary["plan"].get("context")
    if need and need.get("rows"):
        lines += [
            "",
            f"## The context a slot needs ({need['conversations']} conversations: {need['source']})",
            "",
            "| conversation | tokens | context per slot | KV type | KV MiB per slot | slots in 1 GiB |",
            "|---|---:|---:|---|---:|---:|",
        ]
        for r in need["rows"]:
            slots = r["slots_in_budget"].get(QUANT)
            held = "–" if slots is None else str(slots)
            lines.append(
                f"| p{r['percentile']} | {r['conversation_tokens']:,} | {r['ctx_per_slot']:,}"
                f" | {r['cache_type']} | {r['kv_bytes_per_slot'] / 2**20:.2f} | {held} |"
            )
    return lines


def noisy_lines(summary: dict[str, Any]) -> list[str]:
    lines = [
        "## The noisy neighbour (A at 2 users; B's users per step)",
        "",
        "| B users | tenant | ok / counted | TTFT p50 ms | TTFT p99 ms | TPOT p99 ms | goodput req/s"
        " | service / demand | fairness (Jain) | its SLO |",
        "|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in summary["noisy_neighbour"]:
        verdict = "–" if r["meets_slo"] is None else ("meets" if r["meets_slo"] else "misses")
        lines.append(
            f"| {r['step']:g} | {r['tenant']} | {r['ok']} / {r['requests']} | {_ms(r['ttft_p50_s'])}"
            f" | {_ms(r['ttft_p99_s'])} | {_ms(r['tpot_p99_s'])} | {_num(r['goodput_rps'])}"
            f" | {_num(r['service_share_over_demand'])} | {_num(r['fairness_index'], 3)} | {verdict} |"
        )
    lines.append("")
    for verdict in summary["noisy_verdicts"]:
        lines.append(f"- {verdict['sentence']}")
        cost = verdict.get("isolation")
        if cost:
            shared = "held" if cost["shared_held"] else "did not hold every tenant's SLO"
            lines.append(
                f"- a server per tenant at B = {cost['step']:g} users: {cost['isolated_servers']} servers"
                f" ({cost['per_tenant']}); the 1 shared server measured there {shared}; {cost['why']}"
            )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument(
        "--from", dest="run_dir", type=Path, help="a finished run directory of this benchmark"
    )
    parser.add_argument("--part", choices=sorted(PARTS), default="all", help="which experiments to run")
    args = parser.parse_args()
    load_before = os.getloadavg()
    since = mark()
    with tempfile.TemporaryDirectory(prefix="ql-ctx-tenants-") as tmp:
        started = time.monotonic()
        if args.run_dir is None:
            run_dir, seconds = measure(args.model, Path(tmp), PARTS[args.part])
        else:
            run_dir, seconds = args.run_dir, {}
        wall_s = time.monotonic() - started
        summary = json.loads((run_dir / "summary.json").read_text())
        others = other_cpu_frac(since)
        load_after = os.getloadavg()
        lines = [
            f"# Contexts and tenants on {args.model} {QUANT}: {datetime.now(UTC):%Y-%m-%d %H:%M} UTC",
            "",
            f"wall time {wall_s:.0f} s ("
            + ", ".join(f"{name} {value:.0f} s" for name, value in seconds.items())
            + f"); load average {load_before[0]:.1f} before, {load_after[0]:.1f} after; other processes'"
            f" CPU share {'not measured' if others is None else f'{others:.0%}'}",
            "",
            *(context_lines(summary) if summary["context_policies"] else []),
            "",
            *(noisy_lines(summary) if summary["noisy_neighbour"] else []),
        ]
        text = "\n".join(lines) + "\n"
        print(text)
        stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        figures = HERE / "figures"
        figures.mkdir(exist_ok=True)
        (figures / f"context_tenants-{stamp}.md").write_text(text, encoding="utf-8")
        keep = {
            k: summary[k] for k in ("context_policies", "context_turns", "noisy_neighbour", "noisy_verdicts")
        }
        keep["slot_context"] = summary["plan"].get("context")
        (figures / f"context_tenants-{stamp}.json").write_text(json.dumps(keep, indent=2), encoding="utf-8")
        if args.run_dir is None:
            kept = figures / f"context_tenants-{stamp}-report"
            kept.mkdir()
            for name in ("report.md", "summary.json"):
                shutil.copy(run_dir / name, kept / name)
            shutil.copytree(run_dir / "plots", kept / "plots")


if __name__ == "__main__":
    main()
