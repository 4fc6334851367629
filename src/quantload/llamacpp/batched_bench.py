"""Running llama-batched-bench and reading its rows: how long B sequences take to prefill and decode.

`llama-batched-bench -m FILE -c CTX -b B -ub UB -npp a,b -ntg n -npl 1,2,4,8 -t T --output-format
jsonl` (`tools/batched-bench/batched-bench.cpp` of the pinned llama.cpp) runs one test for every
(PP, TG, B) of -npp x -ntg x -npl, in that nesting order, on one context of CTX cells
with room for max(-npl) sequences. Each test, from an emptied KV cache:

- Prefill (T_PP): one batch holding B separate prompts of PP random tokens each (sequence j at
  positions 0..PP-1; only each prompt's last token asks for logits), B*PP tokens, decoded in
  llama_decode calls of at most -b tokens (llama.cpp splits each call into ubatches of at most
  -ub tokens), synchronized once at the end. With -pps (shared prompt) the batch is ONE prompt of PP
  tokens, copied afterwards to the other B-1 sequences outside both timings. quantload never passes
  -pps: llama-server does not share prompts between slots.
- Decode (T_TG): TG steps, each ONE llama_decode call of B tokens, one per sequence at position
  PP+i, every one asking for logits, synchronized after each step. Before step i each sequence holds
  PP+i tokens, so the batch's sequences hold B*(PP+i) tokens between them. No sampling: the tokens
  are random (-tgs, not passed, would decode the sequences one after another instead).
- N_KV is the KV cells the test needs, B*(PP+TG) (PP+B*TG with -pps on a unified cache); it is not
  the tokens attended. A test needing more than the context is skipped silently, so the context is
  chosen here to fit every test (`context_for`).
- T = T_PP + T_TG; S_PP = B*PP/T_PP, S_TG = B*TG/T_TG, S = all tokens / T (tokens per second).
  Times are wall-clock seconds from ggml_time_us; one warm-up decode of 16 tokens precedes all
  tests; there are no repetitions.

The KV cache is not unified by default here (one stream per sequence, n_ctx/max(-npl) cells each,
as llama-server with an explicit -np): each sequence attends only its own tokens.
With `--output-format jsonl` each test is one JSON line on stdout (the settings repeated on every
line); the markdown table (the default) is read as well, its settings from the
`llama_batched_bench: n_kv_max = ...` line above it. A run that exits 0 with fewer rows than its
tests is `OutputCutShort` (llama.cpp's logging thread lost the tail) and is run again.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantload.errors import MeasurementError
from quantload.llamacpp.tool_run import (
    OutputCutShort,
    ToolRun,
    logged_output,
    raise_for_load_failure_or_exit,
    run_tool,
    run_until_whole,
)
from quantload.llamacpp.toolchain import BATCHED_BENCH_TOOL, Toolchain
from quantload.progress import ProgressCallback, no_progress

CTX_ROUND = 256  # cells per sequence are rounded up to this
_SETTINGS_LINE = re.compile(r"llama_batched_bench: (n_kv_max = .*)")
_SETTING = re.compile(r"(\w+) = (-?\d+)")
_MD_ROW = re.compile(r"^\|\s*\d")


class BatchedBenchSettings(BaseModel):
    """The settings llama-batched-bench reports for its context."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    n_kv_max: int = Field(description="context cells (-c, as the context made it)")
    n_batch: int = Field(description="-b: most tokens per llama_decode call")
    n_ubatch: int = Field(description="-ub: most tokens per ubatch (one graph computation)")
    flash_attn: int = Field(description="-1 auto, 0 off, 1 on")
    is_pp_shared: int
    n_gpu_layers: int
    n_threads: int
    n_threads_batch: int


class BatchedBenchRow(BaseModel):
    """One test: B sequences of PP prompt tokens prefilled, then TG decode steps of B tokens."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    prompt_tokens: int = Field(ge=1, description="PP: prompt tokens per sequence")
    gen_tokens: int = Field(ge=1, description="TG: decode steps (tokens generated per sequence)")
    sequences: int = Field(ge=1, description="B: sequences prefilled together and decoded together")
    kv_cells: int = Field(description="N_KV: KV cells the test needs, B*(PP+TG) unshared")
    prompt_s: float = Field(ge=0, description="T_PP: seconds to prefill all B prompts")
    gen_s: float = Field(ge=0, description="T_TG: seconds of all TG decode steps together")
    prompt_shared: bool = Field(default=False, description="-pps: one prompt for all sequences")


class BatchedBenchOutput(BaseModel):
    """What one llama-batched-bench run printed: its settings and one row per test."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    settings: BatchedBenchSettings
    rows: list[BatchedBenchRow]


class BatchedBenchResult(BaseModel):
    """A finished run, with what it ran on and how."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: str
    model_size_bytes: int = Field(description="bytes of the model file")
    settings: BatchedBenchSettings
    rows: list[BatchedBenchRow]
    command: list[str]
    wall_time_s: float
    other_cpu_frac: float | None = None
    llama_cpp: dict[str, Any] = Field(description="Toolchain.version_record()")
    measured_at: str = Field(description="UTC time the run finished, ISO 8601")
    runs: int = Field(default=1, description="runs of the command `rows` is the fastest of (fastest_of)")
    run_rows: list[list[BatchedBenchRow]] = Field(
        default_factory=list, description="each run's own rows, when there were several"
    )


def fastest_of(results: Sequence[BatchedBenchResult]) -> BatchedBenchResult:
    """Several runs of one command as one: per test, the fastest prefill and the fastest decode.
    Other processes only ever slow a run down (llama-batched-bench times wall-clock), so the
    minimum is the best estimate of the machine's own speed; every run's rows are kept."""
    if not results:
        raise MeasurementError("no llama-batched-bench runs to combine")
    first = results[0]
    shapes = [[(r.prompt_tokens, r.gen_tokens, r.sequences) for r in result.rows] for result in results]
    if any(shape != shapes[0] for shape in shapes) or any(r.settings != first.settings for r in results):
        raise MeasurementError("llama-batched-bench runs to combine differ in their tests or settings")
    rows = [
        row.model_copy(
            update={
                "prompt_s": min(result.rows[index].prompt_s for result in results),
                "gen_s": min(result.rows[index].gen_s for result in results),
            }
        )
        for index, row in enumerate(first.rows)
    ]
    shares = [r.other_cpu_frac for r in results if r.other_cpu_frac is not None]
    return first.model_copy(
        update={
            "rows": rows,
            "wall_time_s": round(sum(r.wall_time_s for r in results), 3),
            "other_cpu_frac": max(shares) if shares else None,
            "measured_at": results[-1].measured_at,
            "runs": len(results),
            "run_rows": [list(r.rows) for r in results] if len(results) > 1 else [],
        }
    )


def _settings(data: dict[str, Any], where: str) -> BatchedBenchSettings:
    try:
        return BatchedBenchSettings.model_validate(data)
    except ValidationError as error:
        first = error.errors()[0]
        raise MeasurementError(
            f"llama-batched-bench's {where} lacks or mistypes '{'.'.join(map(str, first['loc']))}'",
            "is this llama-batched-bench too old or too new for quantload?",
        ) from None


def _jsonl(lines: Sequence[str]) -> BatchedBenchOutput:
    settings: BatchedBenchSettings | None = None
    rows: list[BatchedBenchRow] = []
    for number, line in enumerate(lines, 1):
        try:
            data = json.loads(line)
            if not isinstance(data, dict):
                raise ValueError("not an object")
            row = BatchedBenchRow(
                prompt_tokens=data["pp"], gen_tokens=data["tg"], sequences=data["pl"],
                kv_cells=data["n_kv"], prompt_s=data["t_pp"], gen_s=data["t_tg"],
                prompt_shared=bool(data["is_pp_shared"]),
            )  # fmt: skip
        except (ValueError, KeyError, TypeError) as error:
            raise OutputCutShort(
                f"llama-batched-bench's JSONL line {number} is not a whole test ({error})",
                "the run was cut short or its output garbled; run it again",
            ) from None
        line_settings = _settings(data, f"JSONL line {number}")
        if settings is not None and line_settings != settings:
            raise MeasurementError(f"llama-batched-bench's JSONL line {number} has other settings")
        settings = line_settings
        rows.append(row)
    assert settings is not None
    return BatchedBenchOutput(settings=settings, rows=rows)


def _markdown(text: str, lines: Sequence[str]) -> BatchedBenchOutput:
    found = _SETTINGS_LINE.search(text)
    if found is None:
        raise OutputCutShort("llama-batched-bench's table has no 'n_kv_max = ...' settings line")
    values = {key: int(value) for key, value in _SETTING.findall(found.group(1))}
    settings = _settings(values, "settings line")
    rows: list[BatchedBenchRow] = []
    for line in lines:
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        try:
            if len(cells) != 10:
                raise ValueError(f"{len(cells)} columns, expected 10")
            pp, tg, pl, n_kv = (int(cell) for cell in cells[:4])
            rows.append(
                BatchedBenchRow(
                    prompt_tokens=pp,
                    gen_tokens=tg,
                    sequences=pl,
                    kv_cells=n_kv,
                    prompt_s=float(cells[4]),
                    gen_s=float(cells[6]),
                    prompt_shared=bool(settings.is_pp_shared),
                )
            )
        except (ValueError, ValidationError) as error:
            raise OutputCutShort(
                f"llama-batched-bench's table row {line.strip()!r} is garbled ({error})"
            ) from None
    return BatchedBenchOutput(settings=settings, rows=rows)


def parse_batched_bench(stdout: str) -> BatchedBenchOutput:
    """The rows of llama-batched-bench's stdout, JSONL or its markdown table; MeasurementError
    (OutputCutShort where running it again may help) when there are none or one is garbled."""
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    json_lines = [line for line in lines if line.startswith("{")]
    if json_lines:
        return _jsonl(json_lines)
    table = [line for line in lines if _MD_ROW.match(line)]
    if table:
        return _markdown(stdout, table)
    raise OutputCutShort("llama-batched-bench printed no test rows", "see its stderr")


def context_for(prompt_tokens: Sequence[int], gen_tokens: Sequence[int], sequences: Sequence[int]) -> int:
    """A context (-c) in which every test fits: max(B) streams of max(PP)+max(TG) cells, rounded
    up to CTX_ROUND cells each (the cache is split evenly between max(B) sequences)."""
    per_sequence = max(prompt_tokens) + max(gen_tokens)
    per_sequence = -(-per_sequence // CTX_ROUND) * CTX_ROUND
    return max(sequences) * per_sequence


def batched_bench_command(
    binary: Path,
    model_path: Path,
    prompt_tokens: Sequence[int],
    gen_tokens: Sequence[int],
    sequences: Sequence[int],
    threads: int = 0,
    n_batch: int = 2048,
    n_ubatch: int = 512,
    layer_args: Sequence[str] = (),
    extra_args: Sequence[str] = (),
) -> list[str]:
    """The llama-batched-bench command line (JSONL output); `threads` 0 keeps the tool's default.
    `extra_args` are further common flags of llama.cpp the tool takes as llama-server does
    (`-ctk/-ctv TYPE`, `-fa on|off|auto`), so the costs are measured with the server's."""
    joined = [",".join(str(n) for n in values) for values in (prompt_tokens, gen_tokens, sequences)]
    command = [
        str(binary), "-m", str(model_path),
        "-c", str(context_for(prompt_tokens, gen_tokens, sequences)),
        "-b", str(n_batch), "-ub", str(n_ubatch),
        "-npp", joined[0], "-ntg", joined[1], "-npl", joined[2],
        "--output-format", "jsonl",
    ]  # fmt: skip
    if threads > 0:
        command += ["-t", str(threads)]
    return command + list(layer_args) + list(extra_args)


def check_grid(
    output: BatchedBenchOutput,
    prompt_tokens: Sequence[int],
    gen_tokens: Sequence[int],
    sequences: Sequence[int],
) -> None:
    """OutputCutShort unless the output holds exactly one row per test asked for."""
    asked = [(pp, tg, pl) for pp in prompt_tokens for tg in gen_tokens for pl in sequences]
    got = [(row.prompt_tokens, row.gen_tokens, row.sequences) for row in output.rows]
    if got != asked:
        raise OutputCutShort(f"llama-batched-bench printed {len(got)} of {len(asked)} tests")


def _check_values(name: str, values: Sequence[int]) -> None:
    if not values or any(value < 1 for value in values):
        raise MeasurementError(f"llama-batched-bench needs positive {name}, got {list(values)}")


def run_batched_bench(
    toolchain: Toolchain,
    model_path: Path,
    prompt_tokens: Sequence[int] = (32, 128, 512),
    gen_tokens: Sequence[int] = (32,),
    sequences: Sequence[int] = (1, 2, 4, 8),
    threads: int = 0,
    n_batch: int = 2048,
    n_ubatch: int = 512,
    timeout_s: float | None = None,
    progress: ProgressCallback = no_progress,
    runner: Callable[..., ToolRun] = run_tool,
    log_path: Path | None = None,
    extra_args: Sequence[str] = (),
) -> BatchedBenchResult:
    """Run llama-batched-bench over -npp x -ntg x -npl on one file, stopped after `timeout_s`;
    MeasurementError (ModelError for a file it cannot load) in one line when it fails."""
    for name, values in (("-npp", prompt_tokens), ("-ntg", gen_tokens), ("-npl", sequences)):
        _check_values(name, values)
    command = batched_bench_command(
        toolchain.path(BATCHED_BENCH_TOOL), model_path, prompt_tokens, gen_tokens, sequences,
        threads, n_batch, n_ubatch, toolchain.layer_args(BATCHED_BENCH_TOOL), extra_args,
    )  # fmt: skip
    total = len(prompt_tokens) * len(gen_tokens) * len(sequences)

    def run_once() -> ToolRun:
        done = 0

        def on_output(stream: str, text: str) -> None:
            nonlocal done
            if stream == "stdout":
                done += text.count("\n{") + text.startswith("{")
                progress(min(done, total), total, "llama-batched-bench tests")

        with logged_output(log_path, command, on_output) as tee:
            return runner(command, on_output=tee, timeout_s=timeout_s)

    def parse(run: ToolRun) -> BatchedBenchOutput:
        _diagnose(run, model_path)
        output = parse_batched_bench(run.stdout)
        check_grid(output, prompt_tokens, gen_tokens, sequences)
        return output

    run, output = run_until_whole(run_once, parse, "llama-batched-bench", progress)
    return BatchedBenchResult(
        model_path=str(model_path),
        model_size_bytes=model_path.stat().st_size,
        settings=output.settings,
        rows=output.rows,
        command=list(run.command),
        wall_time_s=round(run.wall_time_s, 3),
        other_cpu_frac=run.other_cpu_frac,
        llama_cpp=toolchain.version_record(),
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )


def _diagnose(run: ToolRun, model_path: Path) -> None:
    if run.timed_out:
        raise MeasurementError(
            f"llama-batched-bench did not finish within {run.wall_time_s:.0f} s; it was stopped and"
            " no result was recorded",
            "raise the time limit, or use fewer or shorter -npp/-ntg/-npl",
        )
    if run.signal_name is not None:
        raise MeasurementError(
            f"llama-batched-bench was killed by {run.signal_name}; no result was recorded",
            "out of memory? otherwise run it again",
        )
    raise_for_load_failure_or_exit(run, "llama-batched-bench", model_path)
