"""llama-perplexity's KL-divergence mode: writing the base logits, comparing a file against them.

Two kinds of run (tools/perplexity/perplexity.cpp):

1. **base**: the ordinary perplexity run on the reference (F16) file with
   `--kl-divergence-base FILE`; besides its perplexity it saves, for every scored token, the
   reference model's whole log-probability distribution (format: `quantload.llamacpp.kld_base`).
2. **compare**: `--kl-divergence --kl-divergence-base FILE` on another file (or the same file with
   another KV-cache type). It takes the chunks' tokens from FILE (no text is read), scores them
   with the file under test, and prints one row per chunk on stdout::

       chunk             PPL               ln(PPL(Q)/PPL(base))          KL Divergence  ...
          1      17.2087 ±    1.5230       0.00170 ±    0.00207       0.00120 ±    0.00011  ...

   then, from 100 scored tokens on, three blocks of statistics ("Mean    KLD:   0.001234 ±
   0.000123", "99.9%   KLD: ...", "Same top p: 98.431 ± 0.784 %", ...).

Every problem the compare mode finds with the base file (not a base file, cut short, another
vocabulary, a larger context) is an error line on stderr and exit status 0, and two of them
(another vocabulary, a larger context) carry on and print numbers. So the output is always read
for those lines first, and a result is taken only from a run whose statistics are all there.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from quantload.errors import MeasurementError
from quantload.llamacpp.kld_base import BaseHeader, check_base_file, partial_name
from quantload.llamacpp.perplexity import PerplexityRun, run_perplexity, tokens_scored_per_chunk
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
_PAIR = rf"({_NUMBER})\s*±\s*({_NUMBER})"
PLAN = re.compile(r"computing over (\d+) chunks, n_ctx=(\d+), batch_size=(\d+), n_seq=(\d+)")
CHUNK_ROW = re.compile(
    rf"^\s*(\d+)\s+{_PAIR}\s+{_PAIR}\s+{_PAIR}\s+{_PAIR}\s*%\s+{_PAIR}\s*%\s*$", re.MULTILINE
)
STAT_LINE = re.compile(
    rf"^(?P<label>[^:\n]*?(?:PPL|KLD|Δp|top p)[^:\n]*?)\s*:\s*(?P<value>{_NUMBER})\s*%?"
    rf"(?:\s*±\s*(?P<error>{_NUMBER}))?\s*%?\s*$",
    re.MULTILINE,
)
# llama-perplexity prints no statistics below this many scored tokens (`kld.count < 100`).
MIN_TOKENS_FOR_STATISTICS = 100
# Cache types whose V half needs flash attention (every quantized ggml type).
UNQUANTIZED_CACHE_TYPES = frozenset({"f32", "f16", "bf16"})

# Error lines of the compare mode (all with exit status 0), and of context creation.
VOCAB_MISMATCH = re.compile(r"inconsistent vocabulary \((\d+) vs (\d+)\)")
CTX_MISMATCH = re.compile(r"has been computed with (\d+), while the current context is (\d+)")
NOT_A_BASE = re.compile(r"does not look like a file containing log-probabilities")
CANNOT_OPEN = re.compile(r"kl_divergence: failed to open (.+)$", re.MULTILINE)
BASE_CUT_SHORT = re.compile(
    r"failed reading (?:log-probs for chunk (\d+)|evaluation tokens|n_vocab, n_chunk)"
)
DECODE_FAILED = re.compile(r"failed to decode")
CACHE_BLOCK = re.compile(r"([KV]) cache type (\S+) with block size (\d+) does not divide (\S+)=(\d+)")
NEEDS_FLASH_ATTENTION = re.compile(r"quantized V cache requires flash_attn to be enabled")

# The statistics lines, by their label with runs of spaces collapsed.
PERCENTILE_LABELS: dict[str, str] = {
    "99.9%": "p99_9", "99.0%": "p99", "95.0%": "p95", "90.0%": "p90", "Median": "median",
    "10.0%": "p10", "5.0%": "p5", "1.0%": "p1", "0.1%": "p0_1", "Maximum": "max", "Minimum": "min",
}  # fmt: skip
DELTA_P_EXTRA_LABELS: dict[str, str] = {"75.0%": "p75", "25.0%": "p25"}


def needs_flash_attention(cache_type: str) -> bool:
    """True when llama.cpp needs flash attention on for this V-cache type (any quantized type)."""
    return cache_type not in UNQUANTIZED_CACHE_TYPES


@dataclass(frozen=True)
class KldChunkRow:
    """One row of the per-chunk table: running values over the chunks scored so far."""

    chunk: int
    perplexity: float
    perplexity_error: float
    ln_ppl_ratio: float
    ln_ppl_ratio_error: float
    kld_mean: float
    kld_mean_error: float
    delta_p_rms_pct: float
    delta_p_rms_error_pct: float
    same_top_p_pct: float
    same_top_p_error_pct: float


@dataclass(frozen=True)
class Estimate:
    """A value and its uncertainty (one standard error) as llama-perplexity printed them."""

    value: float
    error: float


@dataclass(frozen=True)
class KldStatistics:
    """The final statistics of one compare run (KLD in nats, Δp and shares in percent)."""

    ppl_q: Estimate
    ppl_base: Estimate
    ln_ppl_correlation_pct: float
    ln_ppl_ratio: Estimate
    ppl_ratio: Estimate
    ppl_diff: Estimate
    kld_mean: Estimate
    kld_quantiles: Mapping[str, float]  # keys of PERCENTILE_LABELS' values: p99_9, median, max...
    delta_p_mean_pct: Estimate
    delta_p_quantiles_pct: Mapping[str, float]  # the same keys, plus p75 and p25
    delta_p_rms_pct: Estimate
    same_top_p_pct: Estimate


@dataclass(frozen=True)
class KldOutput:
    """The parsed result of one complete compare run."""

    n_chunks: int
    ctx_tokens: int
    batch_tokens: int
    n_seq: int
    rows: tuple[KldChunkRow, ...]
    statistics: KldStatistics

    @property
    def tokens_scored(self) -> int:
        """Tokens the statistics rest on."""
        return self.n_chunks * tokens_scored_per_chunk(self.ctx_tokens)


def _number(text: str) -> float:
    return float(text.lstrip("+").replace("-nan", "nan"))


def parse_chunk_rows(stdout: str) -> list[KldChunkRow]:
    """Every per-chunk row printed so far, in order."""
    rows: list[KldChunkRow] = []
    for match in CHUNK_ROW.finditer(stdout):
        chunk, *values = match.groups()
        rows.append(KldChunkRow(int(chunk), *(_number(value) for value in values)))
    return rows


def _statistic_lines(text: str) -> dict[str, tuple[float, float | None]]:
    """{label: (value, error or None)} for every statistics line, labels' spaces collapsed."""
    found: dict[str, tuple[float, float | None]] = {}
    for match in STAT_LINE.finditer(text):
        label = " ".join(match.group("label").split())
        error = match.group("error")
        found[label] = (_number(match.group("value")), None if error is None else _number(error))
    return found


def _quantiles(
    lines: Mapping[str, tuple[float, float | None]], unit: str, labels: Mapping[str, str]
) -> dict[str, float]:
    return {key: lines[f"{label} {unit}"][0] for label, key in labels.items()}


def parse_statistics(text: str, tokens_scored: int) -> KldStatistics:
    """The three statistics blocks; MeasurementError naming what is missing."""
    lines = _statistic_lines(text)
    delta_p_labels = {**PERCENTILE_LABELS, **DELTA_P_EXTRA_LABELS}
    required = [
        "Mean PPL(Q)", "Mean PPL(base)", "Cor(ln(PPL(Q)), ln(PPL(base)))",
        "Mean ln(PPL(Q)/PPL(base))", "Mean PPL(Q)/PPL(base)", "Mean PPL(Q)-PPL(base)",
        "Mean KLD", *(f"{label} KLD" for label in PERCENTILE_LABELS),
        "Mean Δp", *(f"{label} Δp" for label in delta_p_labels), "RMS Δp", "Same top p",
    ]  # fmt: skip
    absent = [label for label in required if label not in lines]
    if absent:
        if len(absent) == len(required) and tokens_scored < MIN_TOKENS_FOR_STATISTICS:
            raise MeasurementError(
                f"llama-perplexity printed no KLD statistics: {tokens_scored} tokens were scored and"
                f" it needs at least {MIN_TOKENS_FOR_STATISTICS}",
                "use more chunks (quality.kld_chunks) or a larger context (quality.ctx)",
            )
        raise OutputCutShort(
            f"llama-perplexity's KLD statistics are incomplete ({len(absent)} of {len(required)}"
            f" lines missing, first '{absent[0]}'): output truncated?",
            "run it again",
        )

    def estimate(label: str) -> Estimate:
        value, error = lines[label]
        return Estimate(value, math.nan if error is None else error)

    statistics = KldStatistics(
        ppl_q=estimate("Mean PPL(Q)"),
        ppl_base=estimate("Mean PPL(base)"),
        ln_ppl_correlation_pct=lines["Cor(ln(PPL(Q)), ln(PPL(base)))"][0],
        ln_ppl_ratio=estimate("Mean ln(PPL(Q)/PPL(base))"),
        ppl_ratio=estimate("Mean PPL(Q)/PPL(base)"),
        ppl_diff=estimate("Mean PPL(Q)-PPL(base)"),
        kld_mean=estimate("Mean KLD"),
        kld_quantiles=_quantiles(lines, "KLD", PERCENTILE_LABELS),
        delta_p_mean_pct=estimate("Mean Δp"),
        delta_p_quantiles_pct=_quantiles(lines, "Δp", delta_p_labels),
        delta_p_rms_pct=estimate("RMS Δp"),
        same_top_p_pct=estimate("Same top p"),
    )
    for name, value in (
        ("the mean KLD", statistics.kld_mean.value),
        ("the same-top-p share", statistics.same_top_p_pct.value),
        ("PPL(Q)", statistics.ppl_q.value),
    ):
        if not math.isfinite(value):
            raise MeasurementError(
                f"llama-perplexity reported {name} = {value}: the model's output is not usable",
                "the model file may be broken; prepare it again",
            )
    return statistics


def parse_kld_output(stdout: str, stderr: str) -> KldOutput:
    """Parse a complete compare run; MeasurementError if it is truncated or inconsistent."""
    both = f"{stderr}\n{stdout}"
    plan = PLAN.search(both)
    if plan is None:
        raise OutputCutShort(
            "llama-perplexity output has no 'kl_divergence: computing over N chunks' line",
            "the run stopped before scoring started; see its stderr",
        )
    n_chunks, ctx_tokens, batch_tokens, n_seq = (int(group) for group in plan.groups())
    rows = parse_chunk_rows(stdout) or parse_chunk_rows(stderr)
    indices = [row.chunk for row in rows]
    if indices != list(range(1, n_chunks + 1)):
        tail = " ".join(stdout.split()[-12:])
        garbled = indices != list(range(1, len(indices) + 1))
        raise (MeasurementError if garbled else OutputCutShort)(
            f"llama-perplexity planned {n_chunks} KLD chunks but printed rows for {len(indices)}"
            f" (chunks {indices[:3]}...{indices[-3:]}; stdout ends '{tail[-160:]}')",
            "the output is truncated or garbled; run it again",
        )
    tokens_scored = n_chunks * tokens_scored_per_chunk(ctx_tokens)
    statistics = parse_statistics(stdout, tokens_scored)
    last = rows[-1]
    if abs(last.kld_mean - statistics.kld_mean.value) > 1e-5 + 1e-3 * abs(statistics.kld_mean.value):
        raise MeasurementError(
            f"llama-perplexity's last KLD row ({last.kld_mean}) differs from its mean KLD"
            f" ({statistics.kld_mean.value})",
            "the output is garbled; run it again",
        )
    return KldOutput(
        n_chunks=n_chunks,
        ctx_tokens=ctx_tokens,
        batch_tokens=batch_tokens,
        n_seq=n_seq,
        rows=tuple(rows),
        statistics=statistics,
    )


def _raise_for_base_problem(run: ToolRun, model_path: Path, base_path: Path) -> None:
    stderr = run.stderr
    if (vocab := VOCAB_MISMATCH.search(stderr)) is not None:
        base_vocab, model_vocab = vocab.groups()
        raise MeasurementError(
            f"the KLD base {base_path} was written by a model with a {int(base_vocab):,}-token"
            f" vocabulary; {model_path} has {int(model_vocab):,}: the base is from another model",
            "compare files of one model only; quantload writes the base from that model's F16",
        )
    if (ctx := CTX_MISMATCH.search(stderr)) is not None:
        base_ctx, run_ctx = ctx.groups()
        raise MeasurementError(
            f"the KLD base {base_path} was written with a context of {base_ctx} tokens; this run"
            f" used {run_ctx}",
            f"compare with --ctx {base_ctx}, or write the base again with the context you want",
        )
    if NOT_A_BASE.search(stderr) is not None:
        raise MeasurementError(
            f"{base_path} is not a llama-perplexity base logits file",
            "delete it; quantload writes a new one",
        )
    if CANNOT_OPEN.search(stderr) is not None:
        raise MeasurementError(
            f"llama-perplexity cannot open the KLD base {base_path}", "measure the base again"
        )
    if (short := BASE_CUT_SHORT.search(stderr)) is not None:
        # llama-perplexity counts chunks from 0 here; people count from 1.
        where = f": it ends before chunk {int(short.group(1)) + 1}" if short.group(1) else ""
        raise MeasurementError(
            f"the KLD base {base_path} is cut short{where} (disk full or killed while written?)",
            "delete it and measure again",
        )


def _raise_for_cache_type_problem(run: ToolRun, model_path: Path) -> None:
    if (block := CACHE_BLOCK.search(run.stderr)) is not None:
        half, cache_type, block_size, dimension, size = block.groups()
        raise MeasurementError(
            f"{model_path}: a {cache_type} {half} cache needs {dimension} ({size}) to be a multiple of"
            f" {block_size}",
            f"drop {cache_type} from quality.kld_cache_types for this model",
        )
    if NEEDS_FLASH_ATTENTION.search(run.stderr) is not None:
        raise MeasurementError(
            f"{model_path}: llama.cpp needs flash attention for a quantized V cache",
            "report this as a quantload bug (it passes -fa on for quantized V)",
        )


def diagnose_kld_failure(run: ToolRun, model_path: Path, base_path: Path) -> None:
    """Raise the error that explains a compare run without a usable result; return if none."""
    done = len(parse_chunk_rows(run.stdout))
    if run.timed_out:
        raise MeasurementError(
            f"llama-perplexity --kl-divergence did not finish within {run.wall_time_s:.0f} s"
            f" ({done} chunks done); it was stopped and no result was recorded",
            "raise quality.timeout_s or lower quality.kld_chunks",
        )
    _raise_for_base_problem(run, model_path, base_path)
    _raise_for_cache_type_problem(run, model_path)
    if DECODE_FAILED.search(run.stderr) is not None:
        raise MeasurementError(f"llama-perplexity failed to decode a chunk with {model_path}", "run it again")
    raise_for_uncaught_exception(run, "llama-perplexity --kl-divergence")
    if run.signal_name is not None:
        raise MeasurementError(
            f"llama-perplexity --kl-divergence was killed by {run.signal_name} after {done} chunks;"
            " no result was recorded",
            "out of memory? try fewer chunks or a smaller --ctx; otherwise run it again",
        )
    raise_for_load_failure_or_exit(run, "llama-perplexity", model_path)


def cache_type_args(cache_type: str) -> list[str]:
    """-ctk/-ctv for a KV-cache type (both halves), with -fa on where a quantized V needs it."""
    if cache_type == "f16":
        return []  # llama.cpp's default: the base is written with it, so pass nothing
    args = ["-ctk", cache_type, "-ctv", cache_type]
    return args + (["-fa", "on"] if needs_flash_attention(cache_type) else [])


def base_command(
    binary: Path,
    model_path: Path,
    dataset_path: Path,
    base_path: Path,
    ctx_tokens: int,
    chunks: int,
    threads: int = 0,
) -> list[str]:
    """The run that scores `model_path` on the text and writes the base logits to `base_path`."""
    command = [
        str(binary),
        "-m", str(model_path),
        "-f", str(dataset_path),
        "-c", str(ctx_tokens),
        "-b", str(ctx_tokens),
        "--chunks", str(chunks if chunks > 0 else -1),
        "--kl-divergence-base", str(base_path),
    ]  # fmt: skip
    return command + (["-t", str(threads)] if threads > 0 else [])


def compare_command(
    binary: Path,
    model_path: Path,
    base_path: Path,
    ctx_tokens: int,
    cache_type: str = "f16",
    threads: int = 0,
) -> list[str]:
    """The run that scores `model_path` (with a KV cache of `cache_type`) against the base."""
    command = [
        str(binary),
        "-m", str(model_path),
        "-c", str(ctx_tokens),
        "-b", str(ctx_tokens),
        "--kl-divergence-base", str(base_path),
        "--kl-divergence",
    ]  # fmt: skip
    command += cache_type_args(cache_type)
    return command + (["-t", str(threads)] if threads > 0 else [])


def _compare_rows(stdout: str) -> list[tuple[int, str]]:
    # only complete lines: a row is printed in pieces
    rows = parse_chunk_rows(stdout[: stdout.rfind("\n") + 1])
    return [(row.chunk, f"mean KLD {row.kld_mean:.5f}") for row in rows]


@dataclass(frozen=True)
class KldRun:
    """A completed compare run: its parsed output and how it was run."""

    output: KldOutput
    command: tuple[str, ...]
    wall_time_s: float
    other_cpu_frac: float | None  # other processes' share of all CPUs during the run


def run_compare(
    toolchain: Toolchain,
    model_path: Path,
    base_path: Path,
    ctx_tokens: int,
    cache_type: str = "f16",
    threads: int = 0,
    progress: ProgressCallback = no_progress,
    timeout_s: float | None = None,
    runner: Callable[..., ToolRun] = run_tool,
    log_path: Path | None = None,
) -> KldRun:
    """Score `model_path` against the base logits; MeasurementError or ModelError on failure."""
    command = compare_command(
        toolchain.path("llama-perplexity"), model_path, base_path, ctx_tokens, cache_type, threads
    )

    def run_once() -> ToolRun:
        chunk_progress = ChunkProgress(progress, PLAN, "comparing", _compare_rows)
        with logged_output(log_path, command, chunk_progress) as on_output:
            run = runner(command, on_output=on_output, timeout_s=timeout_s)
        diagnose_kld_failure(run, model_path, base_path)
        return run

    run, output = run_until_whole(
        run_once,
        lambda run: parse_kld_output(run.stdout, run.stderr),
        "llama-perplexity --kl-divergence",
        progress,
    )
    return KldRun(
        output=output,
        command=run.command,
        wall_time_s=run.wall_time_s,
        other_cpu_frac=run.other_cpu_frac,
    )


def run_base(
    toolchain: Toolchain,
    model_path: Path,
    dataset_path: Path,
    base_path: Path,
    ctx_tokens: int,
    chunks: int,
    threads: int = 0,
    progress: ProgressCallback = no_progress,
    timeout_s: float | None = None,
    runner: Callable[..., ToolRun] = run_tool,
    log_path: Path | None = None,
) -> tuple[PerplexityRun, BaseHeader]:
    """Score `model_path` on the text and write its base logits to `base_path`.

    Returns the perplexity run and the header of the complete file. A run that fails, or leaves a
    file of the wrong size, removes what it wrote and raises MeasurementError or ModelError.
    """
    base_path.parent.mkdir(parents=True, exist_ok=True)
    partial = base_path.with_name(partial_name(base_path.name))
    try:
        run = run_perplexity(
            toolchain, model_path, dataset_path, ctx_tokens, chunks, threads, progress, timeout_s,
            runner, log_path, extra_args=["--kl-divergence-base", str(partial)],
        )  # fmt: skip
        header = check_base_file(partial)
        if (header.ctx_tokens, header.n_chunks) != (ctx_tokens, run.output.n_chunks):
            raise MeasurementError(
                f"the KLD base holds {header.n_chunks} chunks of {header.ctx_tokens} tokens; the run"
                f" scored {run.output.n_chunks} of {ctx_tokens}",
                "report this as a quantload bug",
            )
        partial.replace(base_path)
    finally:
        partial.unlink(missing_ok=True)
    return run, header
