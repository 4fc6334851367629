"""llama.cpp's tools can exit 0 with their last lines lost (their logging thread is not waited for
at exit, so a busy machine can cut the result off): quantload runs such a tool again, says so, and
keeps every run in the log; a file that still fails costs that file only."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from quality_captured import captured_run
from test_kld_measure import write_model

from quantload.cli import cmd_quality
from quantload.cli.main import main
from quantload.config import QualitySettings
from quantload.errors import MeasurementError
from quantload.llamacpp.kld import run_compare
from quantload.llamacpp.perplexity import parse_perplexity_output, run_perplexity
from quantload.llamacpp.tool_run import LOST_OUTPUT_ATTEMPTS, OutputCutShort, ToolRun
from quantload.llamacpp.toolchain import Toolchain
from quantload.progress import ProgressCallback
from quantload.quality.dataset import DatasetInfo
from quantload.quality.results import QualityResult

MODEL, TEXT, BASE = Path("m/Q8_0.gguf"), Path("wiki.test.raw"), Path("base.logits")


class Sequenced:
    """Answers each run with the next captured output; prints it through the callback."""

    def __init__(self, *names: str) -> None:
        self.names = list(names)
        self.runs = 0

    def __call__(self, command: list[str], on_output: Any, timeout_s: float | None = None) -> ToolRun:
        run = captured_run(self.names[min(self.runs, len(self.names) - 1)])
        self.runs += 1
        on_output("stderr", run.stderr)
        on_output("stdout", run.stdout)
        return run


def test_the_captured_lost_tail_is_output_cut_short_not_a_broken_model() -> None:
    run = captured_run("perplexity_lost_tail")
    with pytest.raises(OutputCutShort, match="no 'Final estimate' line"):
        parse_perplexity_output(run.stdout, run.stderr)


def test_a_perplexity_run_that_lost_its_tail_is_run_again_and_both_runs_are_logged(
    fake_toolchain: Toolchain, tmp_path: Path
) -> None:
    runner = Sequenced("perplexity_lost_tail", "perplexity_ok")
    log = tmp_path / "llama-perplexity-Q8_0.log"
    notes: list[str] = []
    done = run_perplexity(
        fake_toolchain, MODEL, TEXT, 128, 3, runner=runner, log_path=log,
        progress=lambda completed, total, note="": notes.append(note),
    )  # fmt: skip
    assert runner.runs == 2 and done.output.perplexity == pytest.approx(143812.2587)
    assert any("output cut short" in note and "running it again" in note for note in notes)
    kept = log.read_text(encoding="utf-8")
    assert kept.count("$ ") == 2 and kept.count("[3]") == 2 and kept.count("Final estimate") == 1


def test_three_runs_cut_short_in_a_row_say_what_happened(fake_toolchain: Toolchain) -> None:
    runner = Sequenced("perplexity_lost_tail")
    with pytest.raises(MeasurementError, match=r"exited 0 but its output ended before its result in 3 runs"):
        run_perplexity(fake_toolchain, MODEL, TEXT, 128, 3, runner=runner)
    assert runner.runs == LOST_OUTPUT_ATTEMPTS


def test_a_real_failure_is_not_run_again(fake_toolchain: Toolchain) -> None:
    runner = Sequenced("perplexity_too_short")
    with pytest.raises(MeasurementError, match="tokenizes to"):
        run_perplexity(fake_toolchain, MODEL, TEXT, 128, 3, runner=runner)
    assert runner.runs == 1


def test_a_kld_comparison_that_lost_its_statistics_is_run_again(fake_toolchain: Toolchain) -> None:
    runner = Sequenced("kld_lost_tail", "kld_tiny_q8_0")
    done = run_compare(fake_toolchain, MODEL, BASE, 128, runner=runner)
    assert runner.runs == 2 and done.output.n_chunks == 3


def test_the_quality_command_measures_every_file_and_the_kld_although_one_failed(
    tmp_path: Path, fake_toolchain: Toolchain, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = tmp_path / "models"
    folder.mkdir()
    models = [write_model(folder / f"tiny-{quant}.gguf", quant) for quant in ("F16", "Q8_0", "Q4_K_M")]
    text = tmp_path / "wiki.test.raw"
    text.write_text("text " * 100)
    measured: list[str] = []
    kld_called: list[dict[str, Any]] = []

    def measure(
        toolchain: Toolchain, model: Path, text: Path, settings: QualitySettings, label: str,
        progress: ProgressCallback, out: Path | None = None, log_path: Path | None = None,
    ) -> QualityResult:  # fmt: skip
        measured.append(label)
        assert log_path == tmp_path / "run" / "logs" / f"llama-perplexity-{label}.log"
        if label == "Q8_0":
            raise MeasurementError("llama-perplexity gave no result: no 'Final estimate' line", "run it again")
        return _result(label, model, text)

    def kld(*args: Any, **kwargs: Any) -> None:
        kld_called.append(kwargs)
        return None

    monkeypatch.setattr(cmd_quality, "ensure_toolchain", lambda *args, **kwargs: fake_toolchain)
    monkeypatch.setattr(cmd_quality, "resolve_dataset", lambda *args: text)
    monkeypatch.setattr(cmd_quality, "measure_file_quality", measure)
    monkeypatch.setattr(cmd_quality, "measure_kld_set", kld)
    out = tmp_path / "run" / "quality.json"
    code = main(["quality", *map(str, models), "--out", str(out)])
    assert measured == ["F16", "Q8_0", "Q4_K_M"], "a failed file must not stop the others"
    assert kld_called and kld_called[0]["log_dir"] == tmp_path / "run" / "logs"
    shown = capsys.readouterr()
    err = shown.err
    assert "F16" in shown.out and "Q4_K_M" in shown.out  # the measured files' table
    assert "perplexity tiny-Q8_0.gguf: llama-perplexity gave no result" in err and "Traceback" not in err
    assert code == 1
    assert "1 llama-perplexity run(s) failed, the others were measured" in err


def _result(label: str, model: Path, text: Path) -> QualityResult:
    return QualityResult(
        quant=label, model_path=str(model), model_name="tiny", model_size_bytes=1,
        dataset=DatasetInfo(name="wikitext", path=str(text), size_bytes=1, sha256="0" * 64),
        ctx_tokens=128, batch_tokens=128, chunks_requested=2, threads=0, chunks_scored=2,
        tokens_scored=126, perplexity=100.0, perplexity_error=1.0, running_perplexity=[100.0, 100.0],
        chunk_perplexity=[100.0, 100.0], wall_time_s=1.0, command=["llama-perplexity"], llama_cpp={},
        measured_at="2026-01-01T00:00:00+00:00",
    )  # fmt: skip
