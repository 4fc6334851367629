"""The KLD step's orchestration, with llama-perplexity played back from captured real runs."""

from __future__ import annotations

import json
from collections import namedtuple
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest
from quality_captured import captured_run

from quantload.config import QualitySettings
from quantload.errors import ConfigError, MeasurementError, QuantloadError
from quantload.llamacpp import kld_base
from quantload.llamacpp.tool_run import ToolRun
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.manifest import Manifest, ManifestEntry, save_manifest
from quantload.progress import ProgressCallback, no_progress
from quantload.quality.kld_measure import (
    KldFile,
    find_reference,
    measure_kld_set,
    measure_manifest_kld,
    vocabulary_size,
)
from quantload.quality.results import load_quality_file

T = TypeVar("T")
TINY_VOCAB = 151_936
TINY_BASE_BYTES = 57_434_876  # measured: tiny F16, 3 chunks of 128 tokens
FILE_TYPES = {"F16": 1, "Q8_0": 7, "Q4_K_M": 15}


def write_model(path: Path, quant: str, vocab: int = TINY_VOCAB) -> Path:
    """A GGUF with just the metadata and token embedding the KLD step reads."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_name("tiny test model")
    writer.add_embedding_length(1)
    writer.add_file_type(FILE_TYPES[quant])
    writer.add_tensor("token_embd.weight", np.zeros((vocab, 1), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.fixture
def models(tmp_path: Path) -> dict[str, Path]:
    folder = tmp_path / "models"
    folder.mkdir()
    return {quant: write_model(folder / f"tiny-{quant}.gguf", quant) for quant in FILE_TYPES}


@pytest.fixture
def text(tmp_path: Path) -> Path:
    path = tmp_path / "wiki.test.raw"
    path.write_text("some text " * 1000)
    return path


def settings(**changes: Any) -> QualitySettings:
    return QualitySettings(**{"ctx": 128, "kld_chunks": 3, **changes})


class FakePerplexity:
    """Answers each command with a captured run: the tiny base, or a tiny comparison."""

    def __init__(self, fail_for: str | None = None) -> None:
        self.commands: list[list[str]] = []
        self.fail_for = fail_for

    def __call__(self, command: list[str], on_output: Any, timeout_s: float | None = None) -> ToolRun:
        self.commands.append(command)
        model = command[command.index("-m") + 1]
        if self.fail_for is not None and model.endswith(self.fail_for):
            return captured_run("kld_killed", returncode=-9)
        if "--kl-divergence" in command:
            return captured_run("kld_tiny_f16_kv_q8_0" if "-ctk" in command else "kld_tiny_q8_0")
        target = Path(command[command.index("--kl-divergence-base") + 1])
        with target.open("wb") as handle:
            handle.write(kld_base.HEADER.pack(kld_base.MAGIC, 128, TINY_VOCAB, 3))
            handle.truncate(TINY_BASE_BYTES)
        return captured_run("kld_base_tiny")

    def runs(self) -> list[tuple[str, str]]:
        """(model file name, KV type or 'base') of each run, in order."""
        return [
            (
                Path(command[command.index("-m") + 1]).name,
                "base" if "--kl-divergence" not in command
                else command[command.index("-ctk") + 1] if "-ctk" in command else "f16",
            )
            for command in self.commands
        ]  # fmt: skip


def files_of(models: dict[str, Path]) -> list[KldFile]:
    return [KldFile(quant, path) for quant, path in models.items()]


def test_base_then_every_file_per_cache_type_floor_first(
    fake_toolchain: Toolchain, models: dict[str, Path], text: Path, tmp_path: Path
) -> None:
    runner = FakePerplexity()
    out = tmp_path / "run" / "quality.json"
    kld = measure_kld_set(
        fake_toolchain, models["F16"], files_of(models), text, tmp_path / "cache", settings(), out,
        source_note="F16 reconstructed from Q4_1", runner=runner,
    )  # fmt: skip
    assert runner.runs() == [
        ("tiny-F16.gguf", "base"),
        ("tiny-F16.gguf", "f16"), ("tiny-Q8_0.gguf", "f16"), ("tiny-Q4_K_M.gguf", "f16"),
        ("tiny-F16.gguf", "q8_0"), ("tiny-Q8_0.gguf", "q8_0"), ("tiny-Q4_K_M.gguf", "q8_0"),
    ]  # fmt: skip
    assert kld is not None
    base = kld.base
    assert (base.quant, base.ctx_tokens, base.chunks_scored, base.tokens_scored) == ("F16", 128, 3, 189)
    assert base.predicted_size_bytes == base.file_size_bytes == TINY_BASE_BYTES
    assert base.source_note == "F16 reconstructed from Q4_1"
    assert (base.kept, base.reused, base.n_vocab) == (False, False, TINY_VOCAB)
    assert not Path(base.file_path).exists()  # removed after use
    floor = kld.floor()
    assert floor is not None and floor.quant == "F16" and floor.cache_type_v == "f16"
    assert [r.is_floor for r in kld.for_cache_type("f16").values()] == [True, False, False]
    quantized_kv = kld.results["Q8_0"]["q8_0"]
    assert (quantized_kv.cache_type_k, quantized_kv.flash_attn) == ("q8_0", "on")
    assert quantized_kv.kld_mean_nats == 0.000001 and quantized_kv.same_top_p_pct == 99.471
    saved = load_quality_file(out)
    assert saved.kld == kld
    assert json.loads(out.read_text())["schema"] == "quantload.quality/2"


def test_the_change_in_perplexity_is_against_the_references_own(
    fake_toolchain: Toolchain, models: dict[str, Path], text: Path, tmp_path: Path
) -> None:
    kld = measure_kld_set(
        fake_toolchain, models["F16"], [KldFile("Q8_0", models["Q8_0"])], text, tmp_path, settings(),
        runner=FakePerplexity(),
    )  # fmt: skip
    assert kld is not None
    result = kld.results["Q8_0"]["f16"]
    # PPL(Q) 143823.6916 (compare run) against the base run's own 143866.7920
    assert result.ppl_change_pct == pytest.approx(100 * (143823.691629 / 143866.7920 - 1), abs=1e-6)
    assert result.ppl_change_error_pct == pytest.approx(100 * 0.000397 * 143823.691629 / 143866.7920, abs=1e-6)
    assert result.ln_ppl_ratio == -0.0003  # llama.cpp's, against the stored base


def test_the_reference_is_compared_with_itself_when_not_listed(
    fake_toolchain: Toolchain, models: dict[str, Path], text: Path, tmp_path: Path
) -> None:
    runner = FakePerplexity()
    kld = measure_kld_set(
        fake_toolchain, models["F16"], [KldFile("Q4_K_M", models["Q4_K_M"])], text, tmp_path,
        settings(kld_cache_types=("f16",)), runner=runner,
    )  # fmt: skip
    assert kld is not None and list(kld.results) == ["F16", "Q4_K_M"]
    assert runner.runs()[1] == ("tiny-F16.gguf", "f16")


def test_a_kept_base_is_reused_by_the_next_measurement(
    fake_toolchain: Toolchain, models: dict[str, Path], text: Path, tmp_path: Path
) -> None:
    keep = settings(kld_keep_base=True, kld_cache_types=("f16",))
    first = measure_kld_set(fake_toolchain, models["F16"], [], text, tmp_path, keep, runner=FakePerplexity())
    assert first is not None and first.base.kept and Path(first.base.file_path).is_file()
    runner = FakePerplexity()
    second = measure_kld_set(fake_toolchain, models["F16"], [], text, tmp_path, keep, runner=runner)
    assert second is not None and second.base.reused
    assert second.base.file_path == first.base.file_path
    assert [kind for _, kind in runner.runs()] == ["f16"]  # no base run
    assert Path(second.base.file_path).is_file()


def test_a_kept_base_that_was_cut_short_is_measured_again(
    fake_toolchain: Toolchain, models: dict[str, Path], text: Path, tmp_path: Path
) -> None:
    keep = settings(kld_keep_base=True, kld_cache_types=("f16",))
    first = measure_kld_set(fake_toolchain, models["F16"], [], text, tmp_path, keep, runner=FakePerplexity())
    assert first is not None
    with open(first.base.file_path, "r+b") as handle:
        handle.truncate(1000)
    runner = FakePerplexity()
    second = measure_kld_set(fake_toolchain, models["F16"], [], text, tmp_path, keep, runner=runner)
    assert second is not None and not second.base.reused
    assert runner.runs()[0][1] == "base"


def test_free_disk_is_checked_before_anything_runs(
    fake_toolchain: Toolchain,
    models: dict[str, Path],
    text: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(kld_base.shutil, "disk_usage", lambda path: usage(10**9, 10**9, 50_000_000))
    runner = FakePerplexity()
    with pytest.raises(ConfigError) as error:
        measure_kld_set(fake_toolchain, models["F16"], [], text, tmp_path, settings(), runner=runner)
    message = error.value.one_line()
    assert "needs 57.43 MB" in message and "only 50.00 MB is free" in message
    assert "lower quality.kld_chunks (--kld-chunks)" in message
    assert "\n" not in message
    assert runner.commands == []


def test_too_few_tokens_is_a_config_error_before_running(
    fake_toolchain: Toolchain, models: dict[str, Path], text: Path, tmp_path: Path
) -> None:
    runner = FakePerplexity()
    with pytest.raises(ConfigError, match=r"score 63 tokens; llama-perplexity prints KLD statistics from 100"):
        measure_kld_set(fake_toolchain, models["F16"], [], text, tmp_path, settings(kld_chunks=1), runner=runner)
    assert runner.commands == []


def test_a_failing_file_stops_the_set_and_the_base_is_still_removed(
    fake_toolchain: Toolchain, models: dict[str, Path], text: Path, tmp_path: Path
) -> None:
    out = tmp_path / "quality.json"
    with pytest.raises(MeasurementError, match=r"killed by SIGKILL"):
        measure_kld_set(
            fake_toolchain, models["F16"], files_of(models), text, tmp_path / "cache", settings(), out,
            runner=FakePerplexity(fail_for="Q8_0.gguf"),
        )  # fmt: skip
    assert list((tmp_path / "cache" / "kld").iterdir()) == []
    saved = load_quality_file(out).kld
    assert saved is not None and list(saved.results) == ["F16"]  # what was measured is kept


def test_an_attempt_that_records_errors_lets_the_other_files_be_measured(
    fake_toolchain: Toolchain, models: dict[str, Path], text: Path, tmp_path: Path
) -> None:
    failures: list[tuple[str, str | None, str]] = []

    def forgiving(title: str, label: str | None, body: Callable[[ProgressCallback], T]) -> T | None:
        try:
            return body(no_progress)
        except QuantloadError as error:
            failures.append((title, label, error.one_line()))
            return None

    kld = measure_kld_set(
        fake_toolchain, models["F16"], files_of(models), text, tmp_path, settings(), attempt=forgiving,
        runner=FakePerplexity(fail_for="Q8_0.gguf"),
    )  # fmt: skip
    assert kld is not None and list(kld.results) == ["F16", "Q4_K_M"]
    assert [(title, label) for title, label, _ in failures] == [("KLD Q8_0", "Q8_0"), ("KLD Q8_0 KV q8_0", "Q8_0")]


def test_an_attempt_that_records_a_failed_base_ends_the_set(
    fake_toolchain: Toolchain, models: dict[str, Path], text: Path, tmp_path: Path
) -> None:
    labels: list[str | None] = []

    def forgiving(title: str, label: str | None, body: Callable[[ProgressCallback], T]) -> T | None:
        labels.append(label)
        try:
            return body(no_progress)
        except QuantloadError:
            return None

    runner = FakePerplexity(fail_for="F16.gguf")
    assert measure_kld_set(
        fake_toolchain, models["F16"], files_of(models), text, tmp_path, settings(), attempt=forgiving,
        runner=runner,
    ) is None  # fmt: skip
    assert labels == [None] and len(runner.commands) == 1


def test_a_file_of_another_vocabulary_is_refused_before_running(
    fake_toolchain: Toolchain, models: dict[str, Path], text: Path, tmp_path: Path
) -> None:
    stranger = write_model(tmp_path / "other-Q8_0.gguf", "Q8_0", vocab=49_152)
    runner = FakePerplexity()
    with pytest.raises(MeasurementError, match=r"49,152-token vocabulary, the KLD base .* has 151,936"):
        measure_kld_set(
            fake_toolchain, models["F16"], [KldFile("Q8_0", stranger)], text, tmp_path,
            settings(kld_cache_types=("f16",)), runner=runner,
        )  # fmt: skip
    assert len(runner.commands) == 2  # the base and the floor; the stranger never ran


def test_vocabulary_size_is_the_embeddings_rows(models: dict[str, Path]) -> None:
    assert vocabulary_size(models["Q8_0"]) == TINY_VOCAB


def test_a_manifest_without_f16_is_a_config_error(fake_toolchain: Toolchain, text: Path, tmp_path: Path) -> None:
    manifest = Manifest(source={}, llama_cpp={}, files={})
    with pytest.raises(ConfigError, match=r"no F16, BF16 or F32 file .*: quality is perplexity only"):
        measure_manifest_kld(fake_toolchain, manifest, ["Q8_0"], text, tmp_path, settings())


def test_the_reference_of_a_manifest_is_its_best_precision_file(tmp_path: Path) -> None:
    files = {q: _entry(tmp_path / f"{q}.gguf", q) for q in ("Q8_0", "F16", "BF16")}
    assert Manifest(source={}, llama_cpp={}, files=files).reference_label() == "BF16"
    assert Manifest(source={}, llama_cpp={}, files=files, reference="F16").reference_label() == "F16"
    del files["BF16"], files["F16"]
    assert Manifest(source={}, llama_cpp={}, files=files).reference_label() is None


def _entry(path: Path, quant: str) -> ManifestEntry:
    return ManifestEntry(
        quant=quant, file=path.name, path=str(path), size_bytes=1, sha256="0" * 64, n_params=1,
        tensor_bytes=1, architecture="qwen2", file_type=quant, made_from="x", seconds=0.0,
    )  # fmt: skip


def test_the_reference_is_the_given_one_an_f16_among_the_files_or_the_manifests(
    models: dict[str, Path], tmp_path: Path
) -> None:
    q8, f16 = models["Q8_0"], models["F16"]
    explicit = tmp_path / "elsewhere-F16.gguf"
    assert find_reference([q8], ["Q8_0"], explicit) == explicit
    assert find_reference([q8, f16], ["Q8_0", "F16"], None) == f16
    assert find_reference([q8], ["Q8_0"], None) is None  # no manifest beside it
    files = {"F16": _entry(f16, "F16"), "Q8_0": _entry(q8, "Q8_0")}
    save_manifest(q8.parent / "manifest.json", Manifest(source={}, llama_cpp={}, files=files))
    assert find_reference([q8], ["Q8_0"], None) == f16
