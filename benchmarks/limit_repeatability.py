"""Does the limit search give the same answer when repeated, and does it agree with the sweep?

Against one real llama-server (SmolLM2-135M Q4_K_M by default, `-np 8 -c 32768`: 8 slots of
4,096 tokens), with the built-in prompts and 32 output tokens: `quantload load -e limit_users`
`--searches` times, then one `quantload load -e sweep` at 1, 2, 4 and 8 users, all judged against
the same SLO by the one judge (quantload.slo), each level decided as it goes within the level
budget. Prints each search's decided limit, undecided levels and first miss, its trials and time,
and each sweep level's verdict beside what the searches said at that level.

    .venv/bin/python benchmarks/limit_repeatability.py [--model smollm2-135m] [--quant Q4_K_M]
        [--searches 5] [--time-cap 1800] [--threads 1] [--out results/bench-limit]
        [--slo-ttft-s 1.0] [--slo-tpot-s 0.1] [--percentile p99] [--level-max-s 600]
        [--max-prompt-tokens 1024] [--max-failed-frac 0.01] [--no-sweep]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from quantload.config import SloSettings, ToolchainSettings
from quantload.llamacpp.server import LlamaServer, ServerSpec
from quantload.llamacpp.toolchain import ensure_toolchain
from quantload.load.limit_file import read_limits
from quantload.load.records import iter_stage_events
from quantload.models.prepared import prepared_folder
from quantload.paths import cache_root
from quantload.slo import Slo, SloCounts, judge


def load(
    out: Path, url: str, quant: str, slo: Slo, level_max_s: float, max_prompt_tokens: int, *extra: str
) -> None:
    command = [
        sys.executable, "-m", "quantload.cli.main", "load", "--url", url, "--name", "bench", "--quant", quant,
        "--out", str(out), "--max-tokens", "32", "--metrics-port", "0", "--slo-ttft", str(slo.ttft_s),
        "--slo-tpot", str(slo.tpot_s), "--slo-ttft-percentile", slo.ttft_percentile,
        "--slo-tpot-percentile", slo.tpot_percentile, *extra,
    ]  # fmt: skip
    env = {
        **os.environ,
        "QUANTLOAD_SLO__LEVEL_MAX_S": str(level_max_s),
        "QUANTLOAD_LOAD__MAX_PROMPT_TOKENS": str(max_prompt_tokens),
        "QUANTLOAD_SLO__MAX_FAILED_FRAC": str(slo.max_failed_frac),
    }
    subprocess.run(command, check=False, timeout=4 * 3600, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--quant", default="Q4_K_M")
    parser.add_argument("--searches", type=int, default=5)
    parser.add_argument("--time-cap", type=float, default=1800.0)
    # one thread: on a shared 2-core machine llama.cpp's default of two decoded over ten times slower
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/bench-limit"))
    defaults = SloSettings()
    parser.add_argument("--slo-ttft-s", type=float, default=defaults.ttft_s)
    parser.add_argument("--slo-tpot-s", type=float, default=defaults.tpot_s)
    parser.add_argument("--percentile", default="p99", help="both limits' percentile")
    parser.add_argument(
        "--max-failed-frac", type=float, default=defaults.max_failed_frac,
        help="the share of requests that may fail (a meet must show at most this: at 0.01 that"
        " alone takes about 300 requests)",
    )  # fmt: skip
    parser.add_argument("--level-max-s", type=float, default=defaults.level_max_s)
    parser.add_argument("--no-sweep", action="store_true")
    parser.add_argument(
        "--max-prompt-tokens", type=int, default=1024, help="built-in prompts up to this long"
    )
    args = parser.parse_args()
    slo = Slo(args.slo_ttft_s, args.slo_tpot_s, args.percentile, args.percentile, args.max_failed_frac)
    toolchain = ensure_toolchain(ToolchainSettings(), os.environ)
    folder = prepared_folder(cache_root(None, os.environ), args.model)
    model = next(folder.glob(f"*-{args.quant}.gguf"), None)
    if model is None:
        hint = f"run `quantload prepare --model {args.model}` first"
        raise SystemExit(f"no {args.quant} file in {folder}: {hint}")
    args.out.mkdir(parents=True, exist_ok=True)
    alias = f"{args.model}-{args.quant}"
    spec = ServerSpec(model_path=model, alias=alias, slots=8, ctx_per_slot=4096, threads=args.threads)
    started = time.monotonic()
    load_before = os.getloadavg()[0]
    with LlamaServer(toolchain, spec, args.out / "llama-server.log") as server:
        for index in range(args.searches):
            search = ("-e", "limit_users", "--time-cap", str(args.time_cap))
            load(
                args.out / f"search-{index}", server.url, args.quant, slo, args.level_max_s,
                args.max_prompt_tokens, *search,
            )  # fmt: skip
        if not args.no_sweep:
            sweep = ("-e", "sweep", "--users", "1,2,4,8", "--repeats", "1")
            load(
                args.out / "sweep", server.url, args.quant, slo, args.level_max_s, args.max_prompt_tokens,
                *sweep,
            )  # fmt: skip
    took = f"{time.monotonic() - started:.0f} s, load average {load_before:.2f} -> {os.getloadavg()[0]:.2f}"
    served = f"-np 8 -c 32768 -t {args.threads}"
    prompts = f"built-in prompts up to {args.max_prompt_tokens} tokens"
    print(f"{args.model} {args.quant}, {served}, 32 output tokens, {prompts}; {took}")
    print(f"SLO: {slo.text()}")
    said_at: dict[int, list[str]] = {}
    for index in range(args.searches):
        for line in read_limits(args.out / f"search-{index}" / "limits.jsonl"):
            trials = ", ".join(f"{int(t.level)}:{t.outcome}" for t in line.trials)
            print(
                f"search {index + 1}: limit {line.limit}, undecided {line.undecided}, misses from"
                f" {line.lowest_miss} ({line.ending}, {line.seconds:.0f} s); trials {trials}"
            )
            for trial in line.trials:
                said_at.setdefault(int(trial.level), []).append(trial.outcome)
    if args.no_sweep:
        return
    summaries = [
        json.loads(text)
        for text in (args.out / "sweep" / "summaries.jsonl").read_text().splitlines()
        if text.strip()
    ]
    for summary in summaries:
        users = int(summary["users"])
        verdict = judge(SloCounts.from_dict(summary["slo_counts"]), slo, users)
        searched = said_at.get(users)
        said = f"searches' trials said {', '.join(searched)}" if searched else "not searched"
        print(f"sweep {users} users: {verdict.outcome} ({verdict.sureness}); {said}")
    ends = [e for e in iter_stage_events(args.out / "sweep" / "stages.jsonl") if e.event == "stage_end"]
    print(f"sweep stages: {[e.status for e in ends]}")


if __name__ == "__main__":
    main()
