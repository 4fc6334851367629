"""llama-perplexity output: parsing real captured runs, and refusing broken ones."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from quality_captured import captured_run

from quantload.errors import MeasurementError, ModelError
from quantload.llamacpp.perplexity import (
    PerplexityOutput,
    diagnose_failure,
    parse_perplexity_output,
    perplexity_command,
    run_perplexity,
    tokens_scored_per_chunk,
)
from quantload.llamacpp.tool_run import ToolRun
from quantload.llamacpp.toolchain import Toolchain

MODEL = Path("tiny/Q8_0.gguf")
TEXT = Path("wiki.test.raw")


def read(captured: Path, name: str) -> tuple[str, str]:
    return (
        (captured / f"{name}.stdout").read_text(encoding="utf-8"),
        (captured / f"{name}.stderr").read_text(encoding="utf-8"),
    )


def test_complete_run_is_parsed(captured: Path) -> None:
    output = parse_perplexity_output(*read(captured, "perplexity_ok"))
    assert output.perplexity == pytest.approx(143812.2587)
    assert output.perplexity_error == pytest.approx(4130.09667)
    assert output.running_perplexity == (137381.7422, 144492.8881, 143812.2587)
    assert (output.n_chunks, output.ctx_tokens) == (3, 128)
    assert (output.batch_tokens, output.n_seq) == (128, 1)
    assert output.tokens_scored == 3 * 63


def test_chunk_values_are_recovered_from_running_values() -> None:
    output = PerplexityOutput(
        perplexity=math.sqrt(10 * 40),
        perplexity_error=1.0,
        running_perplexity=(10.0, math.sqrt(10 * 40)),
        n_chunks=2,
        ctx_tokens=512,
        batch_tokens=512,
        n_seq=1,
    )
    assert output.chunk_perplexity() == pytest.approx((10.0, 40.0))


def test_tokens_scored_is_the_second_half_less_one() -> None:
    assert tokens_scored_per_chunk(512) == 255
    assert tokens_scored_per_chunk(129) == 64


def test_killed_run_has_no_result(captured: Path) -> None:
    stdout, stderr = read(captured, "perplexity_killed")
    with pytest.raises(MeasurementError, match="Final estimate"):
        parse_perplexity_output(stdout, stderr)
    with pytest.raises(MeasurementError, match=r"killed by SIGKILL after 4 chunks"):
        diagnose_failure(captured_run("perplexity_killed", returncode=-9), MODEL, TEXT)


def test_too_short_text_is_a_clear_error_although_the_tool_exits_0(captured: Path) -> None:
    run = captured_run("perplexity_too_short", returncode=0)
    expected = r"only 74 tokens; a context of 128 needs at least 256"
    with pytest.raises(MeasurementError, match=expected):
        diagnose_failure(run, MODEL, TEXT)


def test_model_that_fails_to_load_is_a_model_error() -> None:
    run = captured_run("perplexity_load_failure", returncode=1)
    with pytest.raises(ModelError, match=r"could not load tiny/Q8_0\.gguf"):
        diagnose_failure(run, MODEL, TEXT)


def test_timeout_is_reported_with_chunks_done() -> None:
    run = captured_run("perplexity_killed", returncode=-9, timed_out=True)
    with pytest.raises(MeasurementError, match=r"did not finish .* \(4 chunks done\)"):
        diagnose_failure(run, MODEL, TEXT)


def test_other_nonzero_exit_quotes_stderr() -> None:
    run = ToolRun(("x",), 1, "", "error: failed to open file '/nope.txt'\n", 0.1, False)
    with pytest.raises(MeasurementError, match="status 1: error: failed to open file"):
        diagnose_failure(run, MODEL, TEXT)


def test_successful_run_passes_diagnosis() -> None:
    diagnose_failure(captured_run("perplexity_ok"), MODEL, TEXT)


@pytest.mark.parametrize(
    ("stdout", "stderr_edit", "message"),
    [
        ("[1]137381.7422,[2]1444", None, "planned 3 chunks but printed values for 1"),
        ("", None, "planned 3 chunks but printed values for 0"),
        ("[1]137381.7422,[3]144492.8881,[2]143812.2587,", None, "planned 3 chunks"),
        ("[1]137381.7422,[2]144492.8881,[3]150000.0000,", None, "differs from its final"),
        (None, ("PPL = 143812.2587", "PPL = nan"), "perplexity = nan"),
        (None, ("calculating perplexity over", "calculating over"), "no 'calculating"),
        (None, ("Final estimate: PPL = 143812.2587 +/- 4130.09667", ""), "no 'Final estimate'"),
        (
            None,
            (
                "Final estimate: PPL = 143812.2587 +/- 4130.09667",
                "Unexpected negative standard deviation of log(prob)",
            ),
            "negative variance",
        ),
    ],
)
def test_malformed_output_is_refused(
    captured: Path, stdout: str | None, stderr_edit: tuple[str, str] | None, message: str
) -> None:
    good_stdout, stderr = read(captured, "perplexity_ok")
    if stderr_edit is not None:
        stderr = stderr.replace(*stderr_edit)
    with pytest.raises(MeasurementError, match=message):
        parse_perplexity_output(good_stdout if stdout is None else stdout, stderr)


def test_command_maps_all_chunks_and_default_threads() -> None:
    command = perplexity_command(Path("/b/llama-perplexity"), MODEL, TEXT, 512, 0)
    assert command == [
        "/b/llama-perplexity", "-m", str(MODEL), "-f", str(TEXT),
        "-c", "512", "-b", "512", "--chunks", "-1",
    ]  # fmt: skip
    assert perplexity_command(Path("p"), MODEL, TEXT, 256, 4, threads=2)[-4:] == [
        "--chunks", "4", "-t", "2",
    ]  # fmt: skip


class ReplayRunner:
    """Plays captured output through the output callback in small pieces, like a live process."""

    def __init__(self, run: ToolRun, piece: int = 7) -> None:
        self.run = run
        self.piece = piece
        self.command: list[str] = []

    def __call__(self, command: list[str], on_output: Any, timeout_s: float | None) -> ToolRun:
        self.command = command
        for name, text in (("stderr", self.run.stderr), ("stdout", self.run.stdout)):
            for start in range(0, len(text), self.piece):
                on_output(name, text[start : start + self.piece])
        return self.run


def test_run_drives_progress_chunk_by_chunk(fake_toolchain: Toolchain) -> None:
    calls: list[tuple[float, float | None, str]] = []
    runner = ReplayRunner(captured_run("perplexity_ok"))
    result = run_perplexity(
        fake_toolchain, MODEL, TEXT, 128, 3,
        progress=lambda done, total, note="": calls.append((done, total, note)),
        runner=runner,
    )  # fmt: skip
    assert result.output.perplexity == pytest.approx(143812.2587)
    assert runner.command[0].endswith("llama-perplexity")
    assert [(done, total) for done, total, _ in calls] == [(0, 3), (1, 3), (2, 3), (3, 3)]
    assert calls[-1][2] == "running PPL 143812.2587"


def test_run_refuses_a_context_other_than_asked(fake_toolchain: Toolchain) -> None:
    with pytest.raises(MeasurementError, match="context of 128, not 512"):
        run_perplexity(
            fake_toolchain, MODEL, TEXT, 512, 3, runner=ReplayRunner(captured_run("perplexity_ok"))
        )


def test_real_model_run_is_parsed(captured: Path) -> None:
    output = parse_perplexity_output(*read(captured, "perplexity_smollm2_q8_0"))
    assert (output.perplexity, output.perplexity_error) == (24.0798, 2.42231)
    assert output.running_perplexity == (13.8633, 23.3592, 23.9671, 24.0798)
    assert output.tokens_scored == 4 * 255
    assert output.chunk_perplexity()[0] == pytest.approx(13.8633)
