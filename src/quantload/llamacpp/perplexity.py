"""Running llama-perplexity and reading its result.

llama-perplexity splits the tokenized text into chunks of `ctx` tokens and scores the second half of
each (`ctx - ctx/2 - 1` tokens per chunk). As it goes it prints the running perplexity after each
chunk on stdout (`[1]15.2341,[2]17.0012,...`); at the end it prints
`Final estimate: PPL = 16.1234 +/- 0.51234` on stderr. A text shorter than `2 x ctx` tokens makes it
print an error and exit with status 0, so success is judged from the output, never the exit status.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from quantload.errors import MeasurementError
from quantload.llamacpp.tool_run import (
    ChunkProgress,
    OutputCutShort,
    ToolRun,
    logged_output,
    raise_for_load_failure_or_exit,
    raise_for_uncaught_exception,
    run_tool,
    run_until_whole,
)
from quantload.llamacpp.toolchain import Toolchain
from quantload.progress import ProgressCallback, no_progress

_NUMBER = r"[-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|nan|inf)"
FINAL_ESTIMATE = re.compile(rf"Final estimate: PPL = ({_NUMBER}) \+/- ({_NUMBER})")
CHUNK_VALUE = re.compile(rf"\[(\d+)\]({_NUMBER}),")
PLAN = re.compile(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+), batch_size=(\d+), n_seq=(\d+)")
TOO_SHORT = re.compile(r"you need at least (\d+) tokens to evaluate perplexity with a context of (\d+)")
TOKENIZED_TO = re.compile(r"tokenizes to only (\d+) tokens")
NEGATIVE_VARIANCE = "Unexpected negative standard deviation"
CANNOT_WRITE_LOGITS = re.compile(r"failed to open (.+) for writing")
# The running values are printed with 4 decimals; allow for that when checking the final estimate.
ROUNDING_TOLERANCE = 1e-3


def tokens_scored_per_chunk(ctx_tokens: int) -> int:
    """How many tokens llama-perplexity scores in one chunk: the second half, less one."""
    return ctx_tokens - ctx_tokens // 2 - 1


@dataclass(frozen=True)
class PerplexityOutput:
    """The parsed result of one complete llama-perplexity run."""

    perplexity: float
    perplexity_error: float
    running_perplexity: tuple[float, ...]
    n_chunks: int
    ctx_tokens: int
    batch_tokens: int
    n_seq: int

    @property
    def tokens_scored(self) -> int:
        """Tokens whose log-probability went into the estimate."""
        return self.n_chunks * tokens_scored_per_chunk(self.ctx_tokens)

    def chunk_perplexity(self) -> tuple[float, ...]:
        """Each chunk's own perplexity, recovered from the running values (4-decimal rounding)."""
        values: list[float] = []
        previous_log_sum = 0.0
        for index, running in enumerate(self.running_perplexity, start=1):
            log_sum = index * math.log(running)
            values.append(math.exp(log_sum - previous_log_sum))
            previous_log_sum = log_sum
        return tuple(values)


def parse_running_values(stdout: str) -> list[tuple[int, float]]:
    """Every `[i]value,` pair printed so far, in order."""
    return [(int(index), float(value)) for index, value in CHUNK_VALUE.findall(stdout)]


def _check_finite(name: str, value: float) -> None:
    if not math.isfinite(value):
        raise MeasurementError(
            f"llama-perplexity reported {name} = {value}: the model's output is not usable",
            "the model file may be broken; prepare it again",
        )


def parse_perplexity_output(stdout: str, stderr: str) -> PerplexityOutput:
    """Parse a complete run; raise MeasurementError if the output is truncated or inconsistent."""
    both = f"{stderr}\n{stdout}"
    plan = PLAN.search(both)
    if plan is None:
        raise OutputCutShort(
            "llama-perplexity output has no 'calculating perplexity over N chunks' line",
            "the run stopped before scoring started; see its stderr",
        )
    n_chunks, ctx_tokens, batch_tokens, n_seq = (int(group) for group in plan.groups())
    final = FINAL_ESTIMATE.search(both)
    if final is None:
        if NEGATIVE_VARIANCE in both:
            raise MeasurementError(
                "llama-perplexity gave no result: log-probabilities had a negative variance", "run it again"
            )
        raise OutputCutShort(
            "llama-perplexity gave no result: no 'Final estimate' line (output truncated?)", "run it again"
        )
    perplexity, error = float(final.group(1)), float(final.group(2))
    _check_finite("perplexity", perplexity)
    _check_finite("the perplexity error", error)
    running = parse_running_values(stdout) or parse_running_values(stderr)
    indices = [index for index, _ in running]
    if indices != list(range(1, n_chunks + 1)):
        garbled = indices != list(range(1, len(indices) + 1))
        raise (MeasurementError if garbled else OutputCutShort)(
            f"llama-perplexity planned {n_chunks} chunks but printed values for {len(indices)}"
            f" (indices {indices[:3]}...{indices[-3:]})",
            "the output is truncated or garbled; run it again",
        )
    last = running[-1][1]
    if abs(last - perplexity) > ROUNDING_TOLERANCE * max(1.0, perplexity):
        raise MeasurementError(
            f"llama-perplexity's last running value {last} differs from its final estimate {perplexity}",
            "the output is garbled; run it again",
        )
    return PerplexityOutput(
        perplexity=perplexity,
        perplexity_error=error,
        running_perplexity=tuple(value for _, value in running),
        n_chunks=n_chunks,
        ctx_tokens=ctx_tokens,
        batch_tokens=batch_tokens,
        n_seq=n_seq,
    )


def diagnose_failure(run: ToolRun, model_path: Path, dataset_path: Path) -> None:
    """Raise the error that explains a run which did not complete; return if none applies."""
    done = len(parse_running_values(run.stdout))
    if run.timed_out:
        raise MeasurementError(
            f"llama-perplexity did not finish within {run.wall_time_s:.0f} s ({done} chunks done);"
            " it was stopped and no result was recorded",
            "raise quality.timeout_s or use fewer --chunks",
        )
    raise_for_uncaught_exception(run, "llama-perplexity", dataset_path)
    if run.signal_name is not None:
        raise MeasurementError(
            f"llama-perplexity was killed by {run.signal_name} after {done} chunks; no result was recorded",
            "out of memory? try a smaller --ctx; otherwise run it again",
        )
    short = TOO_SHORT.search(run.stderr)
    if short is not None:
        needed, ctx = short.groups()
        got = TOKENIZED_TO.search(run.stderr)
        have = f"only {got.group(1)} tokens" if got else "too few tokens"
        raise MeasurementError(
            f"{dataset_path} tokenizes to {have}; a context of {ctx} needs at least {needed}",
            "use a longer text (WikiText-2 test) or a smaller --ctx",
        )
    cannot_write = CANNOT_WRITE_LOGITS.search(run.stderr)
    if cannot_write is not None:
        raise MeasurementError(
            f"llama-perplexity cannot write the logits file {cannot_write.group(1)}",
            "check that its folder exists and is writable (toolchain.cache_dir)",
        )
    raise_for_load_failure_or_exit(run, "llama-perplexity", model_path)


def perplexity_command(
    binary: Path,
    model_path: Path,
    dataset_path: Path,
    ctx_tokens: int,
    chunks: int,
    threads: int = 0,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The llama-perplexity command line; `chunks` 0 means every chunk, `threads` 0 its default.

    The batch equals the context, so one chunk is scored per pass and its value is printed at once
    (the estimate does not depend on the batch; this only makes progress visible chunk by chunk).
    """
    command = [
        str(binary),
        "-m", str(model_path),
        "-f", str(dataset_path),
        "-c", str(ctx_tokens),
        "-b", str(ctx_tokens),
        "--chunks", str(chunks if chunks > 0 else -1),
    ]  # fmt: skip
    if threads > 0:
        command += ["-t", str(threads)]
    return command + list(extra_args)


def _running_rows(stdout: str) -> list[tuple[int, str]]:
    return [(index, f"running PPL {value:.4f}") for index, value in parse_running_values(stdout)]


@dataclass(frozen=True)
class PerplexityRun:
    """A completed llama-perplexity run: its parsed output and how it was run."""

    output: PerplexityOutput
    command: tuple[str, ...]
    wall_time_s: float
    other_cpu_frac: float | None = None  # other processes' share of all CPUs during the run


def run_perplexity(
    toolchain: Toolchain,
    model_path: Path,
    dataset_path: Path,
    ctx_tokens: int,
    chunks: int,
    threads: int = 0,
    progress: ProgressCallback = no_progress,
    timeout_s: float | None = None,
    runner: Callable[..., ToolRun] = run_tool,
    log_path: Path | None = None,
    extra_args: Sequence[str] = (),
) -> PerplexityRun:
    """Run llama-perplexity to completion; raise MeasurementError or ModelError otherwise.

    With `log_path`, everything the tool prints is appended there as it comes; `extra_args` go
    at the end of the command line (e.g. `--kl-divergence-base FILE`).
    """
    command = perplexity_command(
        toolchain.path("llama-perplexity"), model_path, dataset_path, ctx_tokens, chunks, threads,
        [*toolchain.layer_args("llama-perplexity"), *extra_args],
    )

    def run_once() -> ToolRun:
        chunk_progress = ChunkProgress(progress, PLAN, "scoring", _running_rows)
        with logged_output(log_path, command, chunk_progress) as on_output:
            run = runner(command, on_output=on_output, timeout_s=timeout_s)
        diagnose_failure(run, model_path, dataset_path)
        return run

    run, output = run_until_whole(
        run_once, lambda run: parse_perplexity_output(run.stdout, run.stderr), "llama-perplexity", progress
    )
    if output.ctx_tokens != ctx_tokens:
        raise MeasurementError(
            f"llama-perplexity used a context of {output.ctx_tokens}, not {ctx_tokens} as asked",
            "report this as a quantload bug",
        )
    return PerplexityRun(
        output=output,
        command=run.command,
        wall_time_s=run.wall_time_s,
        other_cpu_frac=run.other_cpu_frac,
    )
