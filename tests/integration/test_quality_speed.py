"""`quantload quality` and `quantload speed` for real on the tiny model (bounded: tiny ctx, chunks).

The tiny model has random weights, so its perplexity is about its vocabulary size; these tests
check the plumbing (real tools, real output, files, errors), not the numbers.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantload.cli.main import main
from quantload.config import QualitySettings
from quantload.errors import MeasurementError
from quantload.llamacpp.toolchain import Toolchain
from quantload.quality.measure import measure_file_quality
from quantload.quality.results import QUALITY_SCHEMA, load_quality_file
from quantload.roofline.speed_file import SPEED_SCHEMA, load_speed_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]


@pytest.fixture
def cli_env(toolchain: Toolchain, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Point the CLI at the found tools and a private cache (for the probe and downloads)."""
    monkeypatch.setenv("QUANTLOAD_LLAMA_BIN", str(toolchain.path("llama-perplexity").parent))
    monkeypatch.setenv("QUANTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


def test_quality_command_writes_one_entry_per_quant(
    cli_env: Path,
    tiny_models: dict[str, Path],
    wikitext_test_raw: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    out = cli_env / "run" / "quality.json"
    settings = ["--dataset", str(wikitext_test_raw), "--ctx", "128", "--chunks", "2", "--no-kld"]
    assert main(["quality", str(tiny_models["Q8_0"]), *settings, "--out", str(out), "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["schema"] == QUALITY_SCHEMA and list(printed["results"]) == ["Q8_0"]
    assert main(["quality", str(tiny_models["Q4_K_M"]), *settings, "--out", str(out)]) == 0
    saved = load_quality_file(out)
    assert list(saved.results) == ["Q8_0", "Q4_K_M"]
    result = saved.results["Q4_K_M"]
    assert (result.ctx_tokens, result.chunks_scored, result.tokens_scored) == (128, 2, 2 * 63)
    assert len(result.running_perplexity) == 2
    assert result.perplexity == pytest.approx(result.running_perplexity[-1], rel=1e-3)
    assert 1_000 < result.perplexity < 10_000_000  # random weights: about the vocabulary size
    assert result.perplexity_error > 0
    assert result.dataset.size_bytes == wikitext_test_raw.stat().st_size
    assert result.llama_cpp["binary_version"]


def test_quality_table_is_printed(
    cli_env: Path,
    tiny_models: dict[str, Path],
    wikitext_test_raw: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = ["quality", str(tiny_models["Q8_0"]), "--dataset", str(wikitext_test_raw)]
    assert main([*argv, "--ctx", "64", "--chunks", "1", "--no-kld"]) == 0
    out = capsys.readouterr().out
    assert "Perplexity on WikiText-2 test" in out
    assert "Q8_0" in out


def test_progress_follows_the_chunks(
    toolchain: Toolchain, tiny_models: dict[str, Path], wikitext_test_raw: Path
) -> None:
    calls: list[tuple[float, float | None]] = []
    result = measure_file_quality(
        toolchain,
        tiny_models["Q8_0"],
        wikitext_test_raw,
        QualitySettings(ctx=64, chunks=3),
        "Q8_0",
        progress=lambda done, total, note="": calls.append((done, total)),
    )
    assert result.chunks_scored == 3
    assert calls[0] == (0, 3) and calls[-1] == (3, 3)


def test_too_short_text_fails_clearly_and_writes_nothing(
    cli_env: Path,
    tiny_models: dict[str, Path],
    wikitext_test_raw: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    short = cli_env / "short.txt"
    short.write_bytes(wikitext_test_raw.read_bytes()[:300])
    out = cli_env / "quality.json"
    argv = ["quality", str(tiny_models["Q8_0"]), "--dataset", str(short), "--ctx", "128"]
    assert main([*argv, "--out", str(out)]) == 2
    error = capsys.readouterr().err
    assert "tokenizes to only" in error and "a context of 128 needs at least 256" in error
    assert not out.exists()


def test_broken_model_fails_clearly(
    cli_env: Path,
    tiny_models: dict[str, Path],
    wikitext_test_raw: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    broken = cli_env / "broken.gguf"
    broken.write_bytes(tiny_models["Q8_0"].read_bytes()[:1_000_000])
    argv = ["quality", str(broken), "--dataset", str(wikitext_test_raw), "--ctx", "64"]
    assert main(argv) == 2
    assert "broken.gguf" in capsys.readouterr().err


def test_a_run_past_its_time_limit_is_stopped_without_a_result(
    toolchain: Toolchain, tiny_models: dict[str, Path], wikitext_test_raw: Path
) -> None:
    with pytest.raises(MeasurementError, match="did not finish within"):
        measure_file_quality(
            toolchain, tiny_models["F16"], wikitext_test_raw, QualitySettings(ctx=128, timeout_s=2.0), "F16"
        )


def test_speed_command_places_each_file_on_the_roofline(
    cli_env: Path, tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    out = cli_env / "speed.json"
    models = [str(tiny_models["F16"]), str(tiny_models["Q4_K_M"])]
    argv = ["speed", *models, "--prompt", "32", "--gen", "8", "--reps", "2", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "roofline" in printed and "memory bandwidth" in printed
    saved = load_speed_file(out)
    assert saved.schema_id == SPEED_SCHEMA
    assert saved.machine is not None and saved.machine.bandwidth_bytes_per_s > 0
    assert list(saved.results) == ["F16", "Q4_K_M"]
    for quant, entry in saved.results.items():
        assert entry.bench.prefill.n_prompt == 32 and entry.bench.decode.n_gen == 8
        assert len(entry.bench.decode.samples_tokens_per_s) == 2
        if saved.machine.taken_when_busy:
            # other processes shared the cores during the probe: its arithmetic rate reads low (on
            # this machine 30-80 instead of ~200 GFLOP/s), which can flip a small model's bound;
            # the CLI must then say the machine was busy
            assert "other processes used" in printed
        else:
            assert entry.roofline.decode.bound == "memory"
        assert entry.roofline.decode.fraction_of_ceiling > 0
        assert entry.roofline.quant == quant
        assert entry.roofline.explanation.startswith(quant)
    f16, q4 = saved.results["F16"].roofline, saved.results["Q4_K_M"].roofline
    assert q4.decode.ceiling_tokens_per_s > f16.decode.ceiling_tokens_per_s
    assert q4.bits_per_weight < f16.bits_per_weight
