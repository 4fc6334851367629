"""The fast GGUF scan behind read_gguf agrees with gguf.GGUFReader (the library reader, used here
as the reference), and refuses broken files."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from speed_helpers import write_small_gguf

from quantload.errors import ModelError
from quantload.models.gguf_meta import read_gguf
from quantload.models.gguf_scan import scan_gguf


def write_mixed_gguf(path: Path) -> Path:
    """Metadata of every shape (strings, long and short arrays, numbers), F16 and Q8_0 tensors."""
    import gguf
    from gguf.quants import quantize

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("general.name", "mixed")
    writer.add_file_type(7)
    writer.add_array("general.languages", ["en", "fr"])
    writer.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(300)])
    writer.add_array("tokenizer.ggml.scores", [0.5] * 300)
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("some.long_list", list(range(100)))
    writer.add_uint64("some.count", 7)
    writer.add_float32("some.eps", 1e-5)
    writer.add_bool("some.flag", True)
    writer.add_tensor("a.weight", np.ones((32, 64), dtype=np.float16))
    q8 = quantize(np.ones((4, 64), dtype=np.float32), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("b.weight", q8, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


WRITERS: list[Callable[[Path], Path]] = [write_mixed_gguf, write_small_gguf]


@pytest.mark.parametrize("make", WRITERS)
def test_tensor_table_matches_gguf_reader(tmp_path: Path, make: Callable[[Path], Path]) -> None:
    import gguf

    path = make(tmp_path / "m.gguf")
    expected = {t.name: (int(t.n_bytes), int(t.n_elements)) for t in gguf.GGUFReader(path).tensors}
    assert scan_gguf(path).tensor_table() == expected


def _scalar(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


@pytest.mark.parametrize("make", WRITERS)
def test_summary_agrees_with_the_library_reader(tmp_path: Path, make: Callable[[Path], Path]) -> None:
    import gguf

    path = make(tmp_path / "m.gguf")
    reference = gguf.GGUFReader(path)
    fields = {key: field.contents() for key, field in reference.fields.items()}
    summary = read_gguf(path)
    assert summary.architecture == fields["general.architecture"]
    assert summary.n_params == sum(int(t.n_elements) for t in reference.tensors)
    assert summary.tensor_bytes == sum(int(t.n_bytes) for t in reference.tensors)
    assert summary.n_tensors == len(reference.tensors)
    for key, value in fields.items():
        if isinstance(value, list) or (key.startswith("tokenizer.ggml.") and key != "tokenizer.ggml.model"):
            continue
        assert _scalar(summary.metadata[key]) == pytest.approx(_scalar(value)), key


def test_long_arrays_are_summarized_and_tokenizer_lists_skipped(tmp_path: Path) -> None:
    metadata = scan_gguf(write_mixed_gguf(tmp_path / "m.gguf")).metadata
    assert metadata["general.languages"] == ["en", "fr"]
    assert metadata["some.long_list"] == "<100 items>"
    assert metadata["tokenizer.ggml.model"] == "gpt2"
    assert "tokenizer.ggml.tokens" not in metadata
    assert metadata["some.count"] == 7 and metadata["some.flag"] is True


def test_q8_0_bytes_are_counted_per_block(tmp_path: Path) -> None:
    table = scan_gguf(write_mixed_gguf(tmp_path / "m.gguf")).tensor_table()
    assert table["b.weight"] == (4 * 64 // 32 * 34, 4 * 64)
    assert table["a.weight"] == (32 * 64 * 2, 32 * 64)


def test_truncated_or_foreign_files_are_model_errors(tmp_path: Path) -> None:
    whole = write_mixed_gguf(tmp_path / "m.gguf").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(whole[:200])
    with pytest.raises(ModelError, match="truncated"):
        scan_gguf(cut)
    data_cut = tmp_path / "data_cut.gguf"
    data_cut.write_bytes(whole[:-100])
    with pytest.raises(ModelError, match="truncated: tensors end at byte"):
        read_gguf(data_cut)
    other = tmp_path / "other.gguf"
    other.write_bytes(b"PK\x03\x04" + b"\0" * 64)
    with pytest.raises(ModelError, match="not a GGUF file"):
        scan_gguf(other)
