"""Running llama-bench and reading its JSON: prefill (pp) and decode (tg) tokens per second.

`llama-bench -p P -n N -r R -o json` runs two tests on one model: `ppP` (a P-token prompt, no
generation) and `tgN` (N generated tokens after an empty prompt), each R times after one warm-up.
It prints one JSON array on stdout when every test is done; anything else there (a truncated array,
a missing test, a sample count that is not R) is an error, never a partial result.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantload.errors import MeasurementError
from quantload.llamacpp.tool_run import (
    Stream,
    ToolRun,
    logged_output,
    raise_for_load_failure_or_exit,
    run_tool,
)
from quantload.llamacpp.toolchain import Toolchain
from quantload.progress import ProgressCallback, no_progress

_STEP = re.compile(r"llama-bench: benchmark (\d+)/(\d+): (.+)")


class BenchRecord(BaseModel):
    """The fields of one llama-bench JSON record that quantload keeps (others are ignored)."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    build_commit: str
    build_number: int
    cpu_info: str = ""
    gpu_info: str = ""
    backends: str = ""
    model_filename: str
    model_type: str
    model_size: int
    model_n_params: int
    n_batch: int
    n_ubatch: int
    n_threads: int
    type_k: str
    type_v: str
    n_gpu_layers: int
    flash_attn: int | bool | str
    n_prompt: int
    n_gen: int
    n_depth: int = 0
    test_time: str
    avg_ns: int
    stddev_ns: int
    avg_ts: float
    stddev_ts: float
    samples_ns: list[int]
    samples_ts: list[float]


class BenchTest(BaseModel):
    """One llama-bench test: its shape and its speed (mean, standard deviation, every sample)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    n_prompt: int
    n_gen: int
    n_depth: int
    tokens_per_s: float = Field(description="mean over repetitions of tokens / seconds")
    stddev_tokens_per_s: float
    samples_tokens_per_s: list[float]
    mean_ns: int
    stddev_ns: int
    samples_ns: list[int]
    test_time: str

    @classmethod
    def from_record(cls, record: BenchRecord) -> BenchTest:
        """Keep a record's test fields under quantload's names."""
        return cls(
            n_prompt=record.n_prompt,
            n_gen=record.n_gen,
            n_depth=record.n_depth,
            tokens_per_s=record.avg_ts,
            stddev_tokens_per_s=record.stddev_ts,
            samples_tokens_per_s=record.samples_ts,
            mean_ns=record.avg_ns,
            stddev_ns=record.stddev_ns,
            samples_ns=record.samples_ns,
            test_time=record.test_time,
        )


class SpeedResult(BaseModel):
    """llama-bench's prefill and decode speed for one model file, and how it was measured."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model_path: str
    model_type: str = Field(description="llama-bench's description, e.g. 'qwen2 1B Q8_0'")
    model_size_bytes: int = Field(description="bytes of all tensors, as llama-bench counts them")
    model_n_params: int
    reps: int
    n_threads: int
    n_batch: int
    n_ubatch: int
    n_gpu_layers: int
    type_k: str
    type_v: str
    flash_attn: int | bool | str
    backends: str
    cpu_info: str
    gpu_info: str
    build_commit: str
    build_number: int
    prefill: BenchTest
    decode: BenchTest
    wall_time_s: float
    load_average_1m_start: float | None = Field(
        default=None, description="1-minute system load average before the run (None where unknown)"
    )
    load_average_1m_end: float | None = None
    usable_cpus: int | None = Field(default=None, description="CPUs this process may use")
    other_cpu_frac: float | None = Field(
        default=None,
        description="share of all CPUs other processes used during the run (quantload.cpu_share)",
    )
    command: list[str]
    llama_cpp: dict[str, Any] = Field(description="Toolchain.version_record()")
    measured_at: str = Field(description="UTC time the run finished, ISO 8601")


def parse_bench_json(stdout: str) -> list[BenchRecord]:
    """Parse llama-bench's `-o json` array; raise MeasurementError if it is not complete."""
    text = stdout.strip()
    if not text:
        raise MeasurementError("llama-bench printed no JSON", "see its stderr")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise MeasurementError(
            f"llama-bench's JSON is incomplete or malformed ({error.msg} at char {error.pos})",
            "the run was cut short or its output garbled; run it again",
        ) from None
    if not isinstance(data, list) or not data:
        raise MeasurementError("llama-bench's JSON is not a non-empty array of tests")
    records: list[BenchRecord] = []
    for index, item in enumerate(data):
        try:
            records.append(BenchRecord.model_validate(item))
        except ValidationError as error:
            first = error.errors()[0]
            where = ".".join(str(part) for part in first["loc"]) or "the record itself"
            raise MeasurementError(
                f"llama-bench's JSON record {index} lacks or mistypes '{where}': {first['msg']}",
                "is this llama-bench too old or too new for quantload?",
            ) from None
    return records


def pick_test(records: Sequence[BenchRecord], n_prompt: int, n_gen: int, reps: int) -> BenchRecord:
    """The record of the test with this shape, checked to hold `reps` samples."""
    found = [r for r in records if (r.n_prompt, r.n_gen) == (n_prompt, n_gen)]
    name = f"pp{n_prompt}" if n_gen == 0 else f"tg{n_gen}"
    if len(found) != 1:
        raise MeasurementError(f"llama-bench output has {len(found)} {name} tests, expected 1")
    record = found[0]
    if len(record.samples_ts) != reps or len(record.samples_ns) != reps:
        raise MeasurementError(
            f"llama-bench {name} has {len(record.samples_ts)} samples, expected {reps}",
            "the output is garbled; run it again",
        )
    return record


def load_average_1m() -> float | None:
    """The system's 1-minute load average, or None where the platform has none."""
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def usable_cpus() -> int:
    """CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def bench_command(
    binary: Path,
    model_path: Path,
    prompt_tokens: int,
    gen_tokens: int,
    reps: int,
    threads: int,
    layer_args: Sequence[str] = (),
) -> list[str]:
    """The llama-bench command line; `threads` 0 keeps llama-bench's default; `layer_args` place
    the layers (`Toolchain.layer_args`)."""
    command = [
        str(binary),
        "-m", str(model_path),
        "-p", str(prompt_tokens),
        "-n", str(gen_tokens),
        "-r", str(reps),
        "-o", "json",
        "--progress",
    ]  # fmt: skip
    if threads > 0:
        command += ["-t", str(threads)]
    return command + list(layer_args)


class _StepProgress:
    """Turns `--progress` lines on stderr into progress calls: runs done out of runs planned."""

    def __init__(self, progress: ProgressCallback, reps: int) -> None:
        self._progress = progress
        self._runs_per_test = reps + 1  # one warm-up
        self._buffer = ""
        self._done = 0

    def __call__(self, stream: Stream, text: str) -> None:
        if stream != "stderr":
            return
        self._buffer += text
        *lines, self._buffer = self._buffer.split("\n")
        for line in lines:
            step = _STEP.search(line)
            if step is None or step.group(3) == "starting":
                continue
            tests = int(step.group(2))
            self._done += 1
            self._progress(self._done, tests * self._runs_per_test, step.group(3))


def _diagnose(run: ToolRun, model_path: Path) -> None:
    if run.timed_out:
        raise MeasurementError(
            f"llama-bench did not finish within {run.wall_time_s:.0f} s; it was stopped and no"
            " result was recorded",
            "raise speed.timeout_s, or use fewer --reps or tokens",
        )
    if run.signal_name is not None:
        raise MeasurementError(
            f"llama-bench was killed by {run.signal_name}; no result was recorded",
            "out of memory? otherwise run it again",
        )
    raise_for_load_failure_or_exit(run, "llama-bench", model_path)


def measure_speed(
    toolchain: Toolchain,
    model_path: Path,
    prompt_tokens: int = 512,
    gen_tokens: int = 128,
    reps: int = 5,
    threads: int = 0,
    progress: ProgressCallback = no_progress,
    timeout_s: float | None = None,
    runner: Callable[..., ToolRun] = run_tool,
    log_path: Path | None = None,
) -> SpeedResult:
    """Run llama-bench pp`prompt_tokens` and tg`gen_tokens` on one file, `reps` times each.

    With `log_path`, everything the tool prints is appended there as it comes.
    """
    command = bench_command(
        toolchain.path("llama-bench"), model_path, prompt_tokens, gen_tokens, reps, threads,
        toolchain.layer_args("llama-bench"),
    )
    load_start = load_average_1m()
    with logged_output(log_path, command, _StepProgress(progress, reps)) as on_output:
        run = runner(command, on_output=on_output, timeout_s=timeout_s)
    _diagnose(run, model_path)
    records = parse_bench_json(run.stdout)
    prefill = pick_test(records, prompt_tokens, 0, reps)
    decode = pick_test(records, 0, gen_tokens, reps)
    return SpeedResult(
        model_path=str(model_path),
        model_type=prefill.model_type,
        model_size_bytes=prefill.model_size,
        model_n_params=prefill.model_n_params,
        reps=reps,
        n_threads=prefill.n_threads,
        n_batch=prefill.n_batch,
        n_ubatch=prefill.n_ubatch,
        n_gpu_layers=prefill.n_gpu_layers,
        type_k=prefill.type_k,
        type_v=prefill.type_v,
        flash_attn=prefill.flash_attn,
        backends=prefill.backends,
        cpu_info=prefill.cpu_info,
        gpu_info=prefill.gpu_info,
        build_commit=prefill.build_commit,
        build_number=prefill.build_number,
        prefill=BenchTest.from_record(prefill),
        decode=BenchTest.from_record(decode),
        wall_time_s=round(run.wall_time_s, 3),
        load_average_1m_start=load_start,
        load_average_1m_end=load_average_1m(),
        usable_cpus=usable_cpus(),
        other_cpu_frac=run.other_cpu_frac,
        command=list(run.command),
        llama_cpp=toolchain.version_record(),
        measured_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
