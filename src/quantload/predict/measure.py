"""Measuring one model file's cost curves: llama-batched-bench, then the fit (what `quantload
predict` does per file, and its description of the fit). With `repeats` the tool runs that many
times and each test keeps its fastest prefill and decode (`batched_bench.fastest_of`): on a shared
machine the other processes' load, not the model, is most of a single run's error.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from quantload.llamacpp.batched_bench import fastest_of, run_batched_bench
from quantload.llamacpp.toolchain import Toolchain
from quantload.predict.costs import TERMS, CostsFile, fit_costs
from quantload.predict.prediction import ServerFlagsUsed
from quantload.predict.workload_shapes import WorkloadShapes

GEN_TOKENS = 32  # decode steps per llama-batched-bench test
SHORTEST_PROMPT = 32


def measuring_grid(shapes: WorkloadShapes, flags: ServerFlagsUsed) -> tuple[list[int], list[int]]:
    """llama-batched-bench's prompt lengths (-npp: short, the workload's median and its 90th
    percentile) and sequence counts (-npl: powers of two up to the slots, and the slots)."""
    prompts = sorted(shape.prompt_tokens for shape in shapes.shapes.shapes)
    room = max(SHORTEST_PROMPT, flags.ctx_per_slot - GEN_TOKENS - 1)
    picks = {SHORTEST_PROMPT, prompts[len(prompts) // 2], prompts[int(len(prompts) * 0.9)]}
    npp = sorted({min(max(p, SHORTEST_PROMPT), room) for p in picks})
    npl = sorted({n for n in (1, 2, 4, 8, 16, 32, 64) if n <= flags.slots} | {flags.slots})
    return npp, npl


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
