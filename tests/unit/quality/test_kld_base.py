"""The base logits file: its size from the source's layout, its header, and the disk check.

Its tests that start processes: tests/integration/quality/test_kld_base_processes.py.
"""

from __future__ import annotations

from collections import namedtuple
from pathlib import Path

import pytest

from quantload.errors import ConfigError, MeasurementError
from quantload.llamacpp import kld_base
from quantload.llamacpp.kld_base import (
    HEADER,
    MAGIC,
    base_file_size_bytes,
    check_base_file,
    check_free_space,
    format_bytes,
    read_base_header,
    row_values,
)


def test_size_matches_files_llama_perplexity_wrote() -> None:
    # measured: tiny Qwen2-vocabulary model, 3 chunks of 128; SmolLM2, 4 and 40 chunks of 512
    assert base_file_size_bytes(151_936, 128, 3) == 57_434_876
    assert base_file_size_bytes(49_152, 512, 4) == 100_286_452
    assert base_file_size_bytes(49_152, 512, 40) == 1_002_864_340


def test_qwen25_chunk_is_about_77_mb() -> None:
    per_chunk = base_file_size_bytes(151_936, 512, 2) - base_file_size_bytes(151_936, 512, 1)
    assert per_chunk == 512 * 4 + 255 * (151_936 + 4) * 2
    assert 77_000_000 < per_chunk < 78_000_000


def test_rows_round_the_vocabulary_up_to_even() -> None:
    assert row_values(49_152) == 49_156
    assert row_values(49_153) == 49_158


def write_base(path: Path, ctx: int, vocab: int, chunks: int, size: int | None = None) -> Path:
    with path.open("wb") as handle:
        handle.write(HEADER.pack(MAGIC, ctx, vocab, chunks))
        handle.truncate(base_file_size_bytes(vocab, ctx, chunks) if size is None else size)
    return path


def test_a_whole_file_is_accepted_and_its_header_read(tmp_path: Path) -> None:
    header = check_base_file(write_base(tmp_path / "b.logits", 128, 1000, 3))
    assert (header.ctx_tokens, header.n_vocab, header.n_chunks, header.tokens_scored) == (128, 1000, 3, 189)


def test_a_short_file_is_refused_with_both_sizes(tmp_path: Path) -> None:
    path = write_base(tmp_path / "b.logits", 128, 1000, 3, size=5000)
    with pytest.raises(MeasurementError, match=r"has 5,000 bytes, but 3 chunks of 128 tokens .* need 381,068"):
        check_base_file(path)


def test_another_file_is_not_a_base(tmp_path: Path) -> None:
    path = tmp_path / "text.logits"
    path.write_text("= Robert Boulter = and more text")
    with pytest.raises(MeasurementError, match=r"not a llama-perplexity base logits file"):
        read_base_header(path)


def test_too_little_free_disk_is_one_line_naming_size_and_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(kld_base.shutil, "disk_usage", lambda path: usage(0, 0, 900_000_000))
    with pytest.raises(ConfigError) as error:
        check_free_space(tmp_path / "kld", 1_002_864_340, "quality.kld_chunks (--kld-chunks)")
    line = error.value.one_line()
    assert "needs 1.00 GB" in line and "only 900.00 MB is free" in line
    assert "lower quality.kld_chunks (--kld-chunks)" in line and "\n" not in line
    check_free_space(tmp_path / "kld", 100_000_000, "x")  # fits with the headroom


def test_sizes_read_in_decimal_units() -> None:
    assert [format_bytes(n) for n in (512, 77_500_000, 1_002_864_340)] == ["512 bytes", "77.50 MB", "1.00 GB"]
