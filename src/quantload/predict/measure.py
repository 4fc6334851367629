"""Measuring one model file's cost curves: llama-batched-bench, then the fit, then costs.json.

    python -m quantload.predict.measure MODEL.gguf --npp 32,128,512 --ntg 32 --npl 1,2,4,8 -t 1 \
        [--repeats R] --out costs.json

uses the llama.cpp tools quantload finds or has built (`quantload toolchain`) and prints the
fitted coefficients and the fit's error. With --repeats R the tool runs R times and each test
keeps its fastest prefill and decode (`batched_bench.fastest_of`): on a shared machine the other
processes' load, not the model, is most of a single run's error.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from quantload.config import ToolchainSettings
from quantload.errors import QuantloadError
from quantload.llamacpp.batched_bench import fastest_of, run_batched_bench
from quantload.llamacpp.toolchain import Toolchain, ensure_toolchain
from quantload.predict.costs import TERMS, CostsFile, fit_costs, write_costs_file


def measure_costs(
    toolchain: Toolchain,
    model_path: Path,
    prompt_tokens: Sequence[int] = (32, 128, 512),
    gen_tokens: Sequence[int] = (32,),
    sequences: Sequence[int] = (1, 2, 4, 8),
    threads: int = 0,
    n_batch: int = 2048,
    n_ubatch: int = 512,
    timeout_s: float | None = 600.0,
    log_path: Path | None = None,
    repeats: int = 1,
) -> CostsFile:
    """Run llama-batched-bench `repeats` times on `model_path` and fit its cost curves to the
    fastest of each test (`timeout_s` bounds each run)."""
    results = []
    for _ in range(max(1, repeats)):
        result = run_batched_bench(
            toolchain, model_path, prompt_tokens, gen_tokens, sequences, threads=threads,
            n_batch=n_batch, n_ubatch=n_ubatch, timeout_s=timeout_s, log_path=log_path,
        )  # fmt: skip
        results.append(result)
    return fit_costs(fastest_of(results))


def describe(costs: CostsFile) -> str:
    """The fit in a few lines: each coefficient with its standard error, then the error."""
    fit = costs.fit
    lines = [
        f"{costs.model_path} ({costs.quant_type}, {costs.model_size_bytes} bytes), -t {costs.n_threads}"
        f" -b {costs.n_batch} -ub {costs.n_ubatch}, {fit.observations} observations"
        f" (fastest of {costs.batched_bench.runs} runs)"
    ]
    for term in TERMS:
        lines.append(f"  {term:24s} {fit.coefficients[term]:.4e} +/- {fit.stderr[term]:.1e}")
    lines.append(f"  relative error: rms {fit.relative_rms:.3f}, max {fit.relative_max:.3f}")
    other = costs.batched_bench.other_cpu_frac
    if other is not None:
        lines.append(f"  other processes used {other:.0%} of all CPUs during the run (wall-clock timings)")
    return "\n".join(lines)


def _ints(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m quantload.predict.measure", description=__doc__)
    parser.add_argument("model", type=Path)
    parser.add_argument("--npp", type=_ints, default=[32, 128, 512])
    parser.add_argument("--ntg", type=_ints, default=[32])
    parser.add_argument("--npl", type=_ints, default=[1, 2, 4, 8])
    parser.add_argument("-t", "--threads", type=int, default=0)
    parser.add_argument("-b", "--batch", type=int, default=2048)
    parser.add_argument("-ub", "--ubatch", type=int, default=512)
    parser.add_argument("--timeout-s", type=float, default=600.0, help="per run")
    parser.add_argument("--repeats", type=int, default=1, help="runs; each test keeps its fastest")
    parser.add_argument("--out", type=Path, default=None, help="write costs.json here")
    args = parser.parse_args(argv)
    try:
        toolchain = ensure_toolchain(ToolchainSettings(), os.environ)
        costs = measure_costs(
            toolchain, args.model, args.npp, args.ntg, args.npl, args.threads, args.batch, args.ubatch,
            args.timeout_s, repeats=args.repeats,
        )  # fmt: skip
    except QuantloadError as error:
        sys.stderr.write(f"error: {error.one_line()}\n")
        return 1
    sys.stdout.write(describe(costs) + "\n")
    if args.out is not None:
        write_costs_file(args.out, costs)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
