"""Does the limit search give the same answer when repeated, and does it agree with the sweep?

Against one real llama-server (SmolLM2-135M Q4_K_M by default, `-np 8 -c 32768`: 8 slots of
4,096 tokens), with the built-in prompts and 32 output tokens: `quantload load -e limit_users`
`--repeats-of-search` times, then one `quantload load -e sweep` at 1, 2, 4 and 8 users, all
judged against the same SLO by the one judge (quantload.slo). Prints each search's limit and
trials, and each sweep level's verdict beside what the searches said at that level.

    .venv/bin/python benchmarks/limit_repeatability.py [--model smollm2-135m] [--quant Q4_K_M]
        [--searches 3] [--time-cap 600] [--threads 1] [--out results/bench-limit]
        [--slo-ttft-p99-s 1.0] [--slo-tpot-s 0.1]   ([report]'s defaults; the same for every load)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from quantload.config import ReportSettings, ToolchainSettings
from quantload.llamacpp.server import LlamaServer, ServerSpec
from quantload.llamacpp.toolchain import ensure_toolchain
from quantload.load import iter_stage_events, read_limits
from quantload.paths import cache_root
from quantload.slo import Slo, SloCounts, judge
from quantload.steps.prepare import prepared_folder


def load(out: Path, url: str, quant: str, slo: Slo, *extra: str) -> None:
    command = [
        sys.executable, "-m", "quantload.cli.main", "load", "--url", url, "--name", "bench", "--quant", quant,
        "--out", str(out), "--max-tokens", "32", "--metrics-port", "0", *extra,
    ]  # fmt: skip
    env = {
        **os.environ,
        "QUANTLOAD_REPORT__SLO_TTFT_P99_S": str(slo.ttft_p99_s),
        "QUANTLOAD_REPORT__SLO_TPOT_S": str(slo.tpot_p99_s),
    }
    subprocess.run(command, check=False, timeout=3600, env=env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--quant", default="Q4_K_M")
    parser.add_argument("--searches", type=int, default=3)
    parser.add_argument("--time-cap", type=float, default=600.0)
    # one thread: on a shared 2-core machine llama.cpp's default of two decoded over ten times slower
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("results/bench-limit"))
    defaults = ReportSettings()
    parser.add_argument("--slo-ttft-p99-s", type=float, default=defaults.slo_ttft_p99_s)
    parser.add_argument("--slo-tpot-s", type=float, default=defaults.slo_tpot_s)
    args = parser.parse_args()
    slo = Slo(args.slo_ttft_p99_s, args.slo_tpot_s)
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
            load(args.out / f"search-{index}", server.url, args.quant, slo, "-e", "limit_users", "--time-cap",
                 str(args.time_cap))  # fmt: skip
        sweep = ("-e", "sweep", "--users", "1,2,4,8", "--repeats", "1")
        load(args.out / "sweep", server.url, args.quant, slo, *sweep)
    took = f"{time.monotonic() - started:.0f} s, load average {load_before:.2f} -> {os.getloadavg()[0]:.2f}"
    served = f"-np 8 -c 32768 -t {args.threads}"
    print(f"{args.model} {args.quant}, {served}, 32 output tokens, built-in prompts; {took}")
    print(f"SLO: {slo.text()}")
    held_at: dict[int, list[bool]] = {}
    for index in range(args.searches):
        for line in read_limits(args.out / f"search-{index}" / "limits.jsonl"):
            trials = ", ".join(f"{int(t.level)}{'+' if t.held else '-'}" for t in line.trials)
            print(f"search {index + 1}: limit {line.limit} ({line.ending}); trials {trials}")
            for trial in line.trials:
                held_at.setdefault(int(trial.level), []).append(trial.held)
    summaries = [
        json.loads(text)
        for text in (args.out / "sweep" / "summaries.jsonl").read_text().splitlines()
        if text.strip()
    ]
    for summary in summaries:
        verdict = judge(SloCounts(**summary["slo_counts"]), slo)
        users = int(summary["users"])
        searched = held_at.get(users)
        said = f"searches' trials held {sum(searched)} of {len(searched)}" if searched else "not searched"
        print(f"sweep {users} users: {'meets' if verdict.meets else 'misses'} ({verdict.sureness}); {said}")
    ends = [e for e in iter_stage_events(args.out / "sweep" / "stages.jsonl") if e.event == "stage_end"]
    print(f"sweep stages: {[e.status for e in ends]}")


if __name__ == "__main__":
    main()
