"""Real llama-quantize and llama-server on the tiny model (and SmolLM2 when asked for)."""

from __future__ import annotations

import functools
import os
import shutil
import time
from pathlib import Path

import pytest

from quantload.config import ToolchainSettings
from quantload.errors import ModelError
from quantload.kvcache import kv_shape_from_gguf, predict_kv
from quantload.kvcheck import kv_check_with_server
from quantload.llamacpp.server import ServerSpec
from quantload.llamacpp.toolchain import Toolchain, ensure_llama_source
from quantload.models.gguf_meta import read_gguf
from quantload.models.manifest import load_manifest
from quantload.models.prepare import prepare_models
from quantload.paths import cache_root

pytestmark = pytest.mark.integration


def _prepare(source: str, out: Path, toolchain: Toolchain) -> object:
    return prepare_models(
        source, out, toolchain, cache_root(None, os.environ), os.environ,
        functools.partial(ensure_llama_source, ToolchainSettings(), os.environ),
    )


def test_tiny_prepare_makes_three_files_and_manifest(tiny_models: dict[str, Path]) -> None:
    assert set(tiny_models) == {"F16", "Q8_0", "Q4_K_M"}
    manifest = load_manifest(tiny_models["F16"].parent / "manifest.json")
    assert manifest is not None
    # the folder is shared through the cache: other runs may have added files of their own to it
    files = {quant: manifest.files[quant] for quant in tiny_models}
    sizes = {quant: entry.size_bytes for quant, entry in files.items()}
    assert sizes["F16"] > sizes["Q8_0"] > sizes["Q4_K_M"]
    for quant, entry in files.items():
        assert entry.file_type == quant
        assert entry.architecture == "qwen2"
        assert len(entry.sha256) == 64
        assert entry.n_params > 30_000_000
    assert manifest.llama_cpp["binary_version"].startswith("version")


def test_prepare_is_idempotent_and_rebuilds_a_corrupt_file(
    tiny_models: dict[str, Path], toolchain: Toolchain, tmp_path: Path
) -> None:
    out = tmp_path / "tiny"
    out.mkdir()
    for path in tiny_models.values():
        os.link(path, out / path.name)
    shutil.copyfile(tiny_models["F16"].parent / "manifest.json", out / "manifest.json")
    first = _prepare("tiny", out, toolchain)
    started = time.monotonic()
    second = _prepare("tiny", out, toolchain)
    assert time.monotonic() - started < 30
    assert first == second
    q8 = out / second.files["Q8_0"].file  # type: ignore[attr-defined]
    data = q8.read_bytes()
    q8.unlink()
    q8.write_bytes(data[: len(data) // 2])
    third = _prepare("tiny", out, toolchain)
    assert third.files["Q8_0"].sha256 == second.files["Q8_0"].sha256  # type: ignore[attr-defined]
    # the rebuilt file names the llama.cpp that wrote it; a reused one keeps what made it
    assert third.files["Q8_0"].made_with == f"{toolchain.label} ({toolchain.binary_version})"  # type: ignore[attr-defined]
    assert third.files["F16"].made_with == first.files["F16"].made_with  # type: ignore[attr-defined]
    read_gguf(q8)
    assert not list(out.glob("*.partial"))


def test_non_gguf_source_leaves_nothing_behind(toolchain: Toolchain, tmp_path: Path) -> None:
    bogus = tmp_path / "model.gguf"
    bogus.write_text("not a model")
    out = tmp_path / "out"
    with pytest.raises(ModelError, match="not a GGUF file"):
        _prepare(str(bogus), out, toolchain)
    assert not out.exists()  # the source is checked before any folder is made


KV_CASES = [
    ("f16", "f16", False),
    ("f16", "f16", True),
    ("q8_0", "q8_0", False),
    ("q8_0", "q8_0", True),
    ("q4_0", "q4_0", False),
    ("q4_0", "q4_0", True),
]


@pytest.mark.parametrize(("type_k", "type_v", "unified"), KV_CASES)
def test_kv_prediction_matches_server_exactly(
    tiny_models: dict[str, Path], toolchain: Toolchain, tmp_path: Path, type_k: str, type_v: str, unified: bool
) -> None:
    model = tiny_models["Q4_K_M"]
    # 3 slots x 900 tokens: the unified pool is pad256(2700) = 2816 cells, the split one
    # 3 x pad256(2816 // 3) = 3072, so the two layouts really differ.
    prediction = predict_kv(kv_shape_from_gguf(read_gguf(model)), 3, 900, type_k, type_v, unified)
    assert prediction.n_stream * prediction.cells_per_stream == (2816 if unified else 3072)
    spec = ServerSpec(model, "tiny", slots=3, ctx_per_slot=900, kv_unified=unified,
                      cache_type_k=type_k, cache_type_v=type_v)
    check = kv_check_with_server(toolchain, spec, prediction, tmp_path / "server.log", 120)
    assert check.reported_mib == check.predicted_mib
    assert check.diff_pct == 0.0
