"""KL divergence for real: llama-perplexity's base and compare runs on the tiny model.

Bounded: 2 chunks of 128 tokens (126 scored, just above the 100 llama-perplexity needs for its
statistics), so the base file is about 38 MB and each run takes a second or two. The tiny model
has random weights: these tests check the plumbing and the order of magnitude, not quality.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantload.cli.main import main
from quantload.config import QualitySettings
from quantload.errors import MeasurementError
from quantload.llamacpp.kld import run_compare
from quantload.llamacpp.kld_base import base_file_size_bytes
from quantload.llamacpp.toolchain import Toolchain
from quantload.quality.kld_measure import KldFile, measure_kld_set, prepare_base
from quantload.quality.results import load_quality_file

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

TINY_VOCAB = 151_936
SETTINGS = QualitySettings(ctx=128, kld_chunks=2, kld_cache_types=("f16", "q8_0"), timeout_s=120)


def test_three_files_and_the_floor_against_the_f16(
    toolchain: Toolchain, tiny_models: dict[str, Path], wikitext_test_raw: Path, tmp_path: Path
) -> None:
    out = tmp_path / "quality.json"
    files = [KldFile(quant, path) for quant, path in tiny_models.items()]
    kld = measure_kld_set(
        toolchain, tiny_models["F16"], files, wikitext_test_raw, tmp_path / "cache", SETTINGS, out,
        source_note="random weights", log_dir=tmp_path / "logs",
    )  # fmt: skip
    assert kld is not None
    base = kld.base
    assert (base.ctx_tokens, base.chunks_scored, base.tokens_scored, base.n_vocab) == (128, 2, 126, TINY_VOCAB)
    assert base.file_size_bytes == base.predicted_size_bytes == base_file_size_bytes(TINY_VOCAB, 128, 2)
    assert not Path(base.file_path).exists()  # removed after use
    assert list((tmp_path / "cache" / "kld").iterdir()) == []
    assert list(kld.results) == ["F16", "Q8_0", "Q4_K_M"]
    assert all(list(per_type) == ["f16", "q8_0"] for per_type in kld.results.values())
    weights = kld.for_cache_type("f16")
    floor, q8, q4 = weights["F16"], weights["Q8_0"], weights["Q4_K_M"]
    assert floor.is_floor and not q8.is_floor and not kld.results["F16"]["q8_0"].is_floor
    assert abs(floor.kld_mean_nats) < 1e-5 and floor.same_top_p_pct == 100.0
    assert abs(floor.ppl_change_pct) < 0.01  # the same file and cache: PPL(Q) is the base's own
    assert floor.kld_mean_nats < q8.kld_mean_nats < q4.kld_mean_nats
    assert q4.kld_p99_9_nats >= q4.kld_p99_nats >= q4.kld_median_nats
    assert kld.results["Q8_0"]["q8_0"].flash_attn == "on" and q8.flash_attn == "auto"
    assert all(result.chunks_scored == 2 and len(result.running_kld_mean_nats) == 2
               for per_type in kld.results.values() for result in per_type.values())  # fmt: skip
    assert load_quality_file(out).kld == kld
    logs = sorted(path.name for path in (tmp_path / "logs").iterdir())
    assert "llama-perplexity-kld-base.log" in logs and "llama-perplexity-kld-Q4_K_M-q8_0.log" in logs


def test_a_base_of_another_context_is_refused_by_the_real_tool(
    toolchain: Toolchain, tiny_models: dict[str, Path], wikitext_test_raw: Path, tmp_path: Path
) -> None:
    settings = QualitySettings(ctx=512, kld_chunks=1, kld_keep_base=True, timeout_s=120)
    prepared = prepare_base(toolchain, tiny_models["F16"], wikitext_test_raw, tmp_path, settings)
    with pytest.raises(MeasurementError, match=r"written with a context of 512 tokens; this run used 256"):
        run_compare(toolchain, tiny_models["Q8_0"], prepared.path, 256, timeout_s=120)


def test_quality_command_prints_and_files_the_kld(
    toolchain: Toolchain,
    tiny_models: dict[str, Path],
    wikitext_test_raw: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("QUANTLOAD_LLAMA_BIN", str(toolchain.path("llama-perplexity").parent))
    monkeypatch.setenv("QUANTLOAD_CACHE_DIR", str(tmp_path / "cache"))
    out = tmp_path / "quality.json"
    argv = [
        "quality", str(tiny_models["Q8_0"]), "--dataset", str(wikitext_test_raw), "--ctx", "128",
        "--chunks", "2", "--kld-chunks", "2", "--kv-types", "f16", "--out", str(out),
    ]  # fmt: skip
    assert main(argv) == 0  # the F16 is found in the manifest beside the Q8_0
    printed = " ".join(capsys.readouterr().out.split())  # the console wraps long lines
    assert "KL divergence from F16" in printed and "F16 (floor)" in printed
    assert "removed after use" in printed
    saved = json.loads(out.read_text())
    assert list(saved["results"]) == ["Q8_0"] and list(saved["kld"]["results"]) == ["F16", "Q8_0"]
    assert saved["kld"]["base"]["source_note"].startswith("random weights")
