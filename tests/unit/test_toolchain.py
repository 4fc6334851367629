"""Finding the llama.cpp tools in a configured folder: all four must be there and must start."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from quantload.config import ToolchainSettings
from quantload.errors import ToolchainError
from quantload.llamacpp.build import TOOL_NAMES
from quantload.llamacpp.toolchain import find_toolchain

WORKING = {
    "llama-server": 'echo "version: 1234 (abc)" >&2',
    "llama-perplexity": 'echo "version: 1234 (abc)" >&2',
    "llama-bench": 'echo "version: 1234 (abc)"',
    "llama-quantize": 'echo "usage: llama-quantize [--help] model-f32.gguf type" >&2; exit 1',
}


def _write_tools(folder: Path, scripts: dict[str, str]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name, body in scripts.items():
        tool = folder / name
        tool.write_text(f"#!/bin/sh\n{body}\n", encoding="utf-8")
        tool.chmod(tool.stat().st_mode | stat.S_IXUSR)


def test_a_folder_of_four_working_tools_is_found(tmp_path: Path) -> None:
    _write_tools(tmp_path, WORKING)
    found = find_toolchain(ToolchainSettings(llama_bin=tmp_path), {})
    assert found is not None
    assert found.origin == "QUANTLOAD_LLAMA_BIN"
    assert found.binary_version == "version: 1234 (abc)"
    assert set(found.tools) == set(TOOL_NAMES)


@pytest.mark.parametrize("broken", ["llama-perplexity", "llama-bench", "llama-quantize"])
def test_a_tool_that_does_not_start_is_named(tmp_path: Path, broken: str) -> None:
    scripts = dict(WORKING)
    scripts[broken] = 'echo "error while loading shared libraries: libggml.so" >&2; exit 127'
    _write_tools(tmp_path, scripts)
    with pytest.raises(ToolchainError, match=broken) as caught:
        find_toolchain(ToolchainSettings(llama_bin=tmp_path), {})
    assert "libggml.so" in str(caught.value)


def test_a_folder_missing_a_tool_names_it(tmp_path: Path) -> None:
    _write_tools(tmp_path, {k: v for k, v in WORKING.items() if k != "llama-bench"})
    with pytest.raises(ToolchainError, match="lacks llama-bench"):
        find_toolchain(ToolchainSettings(llama_bin=tmp_path), {})
