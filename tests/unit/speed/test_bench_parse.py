"""llama-bench JSON: parsing a real captured run, and refusing truncated or malformed output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from speed_helpers import CAPTURED, bench_run

from quantload.errors import MeasurementError, ModelError
from quantload.llamacpp.bench import bench_command, measure_speed, parse_bench_json, pick_test
from quantload.llamacpp.tool_run import ToolRun
from quantload.llamacpp.toolchain import Toolchain

MODEL = Path("tiny/Q4_K_M.gguf")


class FakeRunner:
    """Returns a prepared run after feeding its stderr through the output callback line by line."""

    def __init__(self, run: ToolRun) -> None:
        self.run = run
        self.command: list[str] = []

    def __call__(self, command: list[str], on_output: Any, timeout_s: float | None) -> ToolRun:
        self.command = command
        for line in self.run.stderr.splitlines(keepends=True):
            on_output("stderr", line)
        on_output("stdout", self.run.stdout)
        return self.run


def ok_json() -> str:
    return (CAPTURED / "bench_ok.json").read_text(encoding="utf-8")


def test_real_output_is_parsed() -> None:
    records = parse_bench_json(ok_json())
    prefill = pick_test(records, 64, 0, 3)
    decode = pick_test(records, 0, 16, 3)
    assert prefill.avg_ts == pytest.approx(263.825959)
    assert prefill.samples_ts == [266.59, 258.216, 266.672]
    assert decode.stddev_ts == pytest.approx(8.651353)
    assert (prefill.model_size, prefill.model_n_params) == (32617472, 40076544)
    assert prefill.n_threads == 2


def test_measure_speed_keeps_both_tests_and_reports_progress(fake_toolchain: Toolchain) -> None:
    calls: list[tuple[float, float | None]] = []
    runner = FakeRunner(bench_run("bench_ok.json", "bench_ok.stderr"))
    result = measure_speed(
        fake_toolchain, MODEL, 64, 16, 3, 0,
        progress=lambda done, total, note="": calls.append((done, total)),
        runner=runner,
    )  # fmt: skip
    assert runner.command[-2:] == ["json", "--progress"]
    assert result.prefill.tokens_per_s == pytest.approx(263.825959)
    assert result.decode.samples_tokens_per_s == [24.6941, 39.6012, 24.5404]
    assert result.decode.samples_ns == [647927940, 404027816, 651986611]
    assert result.model_size_bytes == 32617472
    assert result.build_number == 0
    assert result.llama_cpp["binary_version"] == "version: test"
    assert calls == [(step, 8) for step in range(1, 9)]
    assert result.usable_cpus >= 1


def test_killed_run_leaves_truncated_json_that_is_refused() -> None:
    run = bench_run("bench_killed.stdout", "bench_killed.stderr", returncode=-9)
    with pytest.raises(MeasurementError, match="incomplete or malformed"):
        parse_bench_json(run.stdout)


def test_killed_run_is_reported_as_killed(fake_toolchain: Toolchain) -> None:
    runner = FakeRunner(bench_run("bench_killed.stdout", "bench_killed.stderr", returncode=-9))
    with pytest.raises(MeasurementError, match="killed by SIGKILL"):
        measure_speed(fake_toolchain, MODEL, 64, 64, 4, 0, runner=runner)


def test_model_that_fails_to_load_is_a_model_error(fake_toolchain: Toolchain) -> None:
    runner = FakeRunner(bench_run("bench_load_failure.stdout", "bench_load_failure.stderr", 1))
    with pytest.raises(ModelError, match="could not load"):
        measure_speed(fake_toolchain, MODEL, 64, 16, 3, 0, runner=runner)


def test_timeout_is_reported(fake_toolchain: Toolchain) -> None:
    run = ToolRun(("llama-bench",), -9, "[", "", 30.0, timed_out=True)
    with pytest.raises(MeasurementError, match="did not finish within 30 s"):
        measure_speed(fake_toolchain, MODEL, 64, 16, 3, 0, runner=FakeRunner(run))


def _edited(edit: Any) -> str:
    data = json.loads(ok_json())
    edit(data)
    return json.dumps(data)


@pytest.mark.parametrize(
    ("stdout", "message"),
    [
        ("", "printed no JSON"),
        ("[", "incomplete or malformed"),
        (ok_json()[: len(ok_json()) // 2], "incomplete or malformed"),
        ("{}", "not a non-empty array"),
        ("[]", "not a non-empty array"),
        (_edited(lambda d: d[0].pop("avg_ts")), "record 0 lacks or mistypes 'avg_ts'"),
        (
            _edited(lambda d: d[1].update(samples_ts="fast")),
            "record 1 lacks or mistypes 'samples_ts'",
        ),
    ],
)
def test_malformed_json_is_refused(stdout: str, message: str) -> None:
    with pytest.raises(MeasurementError, match=message):
        parse_bench_json(stdout)


def test_missing_test_or_wrong_sample_count_is_refused() -> None:
    records = parse_bench_json(ok_json())
    with pytest.raises(MeasurementError, match="0 pp512 tests"):
        pick_test(records, 512, 0, 3)
    with pytest.raises(MeasurementError, match="3 samples, expected 5"):
        pick_test(records, 0, 16, 5)
    doubled = parse_bench_json(_edited(lambda d: d.append(d[0])))
    with pytest.raises(MeasurementError, match="2 pp64 tests"):
        pick_test(doubled, 64, 0, 3)


def test_command() -> None:
    command = bench_command(Path("/b/llama-bench"), MODEL, 512, 128, 5, 0)
    assert command == [
        "/b/llama-bench", "-m", str(MODEL), "-p", "512", "-n", "128", "-r", "5",
        "-o", "json", "--progress",
    ]  # fmt: skip
    assert bench_command(Path("b"), MODEL, 1, 1, 1, 2)[-2:] == ["-t", "2"]
