"""Finding the llama.cpp tools in a configured folder, the tools started (shell scripts stand in):
the four required ones must start, llama-imatrix and ggml-rpc-server are taken when present and
checked, a tool that does not start is named.

Moved from tests/unit/test_toolchain.py, whose other tests start no process.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from quantload.config import ToolchainSettings
from quantload.errors import ToolchainError
from quantload.llamacpp.build import RPC_SERVER_TOOL
from quantload.llamacpp.toolchain import BATCHED_BENCH_TOOL, IMATRIX_TOOL, REQUIRED_TOOLS, find_toolchain
from toolchain_fakes import RPC_HELP, VERSION, WORKING, write_tools

pytestmark = pytest.mark.integration


def test_a_folder_of_four_working_tools_is_found(tmp_path: Path) -> None:
    write_tools(tmp_path, WORKING)
    found = find_toolchain(ToolchainSettings(llama_bin=tmp_path), {})
    assert found is not None
    assert found.origin == "QUANTLOAD_LLAMA_BIN"
    assert found.binary_version == "version: 1234 (abc)"
    assert set(found.tools) == set(REQUIRED_TOOLS)
    with pytest.raises(ToolchainError, match="have no llama-imatrix"):
        found.path(IMATRIX_TOOL)


def test_llama_imatrix_beside_them_is_taken_and_checked(tmp_path: Path) -> None:
    write_tools(tmp_path, {**WORKING, IMATRIX_TOOL: 'echo "version: 1234 (abc)" >&2'})
    found = find_toolchain(ToolchainSettings(llama_bin=tmp_path), {})
    assert found is not None and set(found.tools) == {*REQUIRED_TOOLS, IMATRIX_TOOL}
    assert found.path(IMATRIX_TOOL) == tmp_path / IMATRIX_TOOL
    write_tools(tmp_path, {IMATRIX_TOOL: "exit 127"})
    with pytest.raises(ToolchainError, match=IMATRIX_TOOL):
        find_toolchain(ToolchainSettings(llama_bin=tmp_path), {})


def test_llama_batched_bench_beside_the_tools_is_taken_and_checked(tmp_path: Path) -> None:
    write_tools(tmp_path, WORKING)
    found = find_toolchain(ToolchainSettings(llama_bin=tmp_path), {})
    assert found is not None
    with pytest.raises(ToolchainError, match="have no llama-batched-bench"):
        found.path(BATCHED_BENCH_TOOL)
    write_tools(tmp_path, {BATCHED_BENCH_TOOL: VERSION})
    found = find_toolchain(ToolchainSettings(llama_bin=tmp_path), {})
    assert found is not None and found.path(BATCHED_BENCH_TOOL) == tmp_path / BATCHED_BENCH_TOOL
    write_tools(tmp_path, {BATCHED_BENCH_TOOL: "exit 127"})
    with pytest.raises(ToolchainError, match=BATCHED_BENCH_TOOL):
        find_toolchain(ToolchainSettings(llama_bin=tmp_path), {})


def test_ggml_rpc_server_beside_the_tools_is_taken_and_checked(tmp_path: Path) -> None:
    write_tools(tmp_path, {**WORKING, RPC_SERVER_TOOL: RPC_HELP})
    found = find_toolchain(ToolchainSettings(llama_bin=tmp_path), {})
    assert found is not None and found.path(RPC_SERVER_TOOL) == tmp_path / RPC_SERVER_TOOL
    write_tools(tmp_path, {RPC_SERVER_TOOL: "exit 127"})
    with pytest.raises(ToolchainError, match=RPC_SERVER_TOOL):
        find_toolchain(ToolchainSettings(llama_bin=tmp_path), {})


@pytest.mark.parametrize("broken", ["llama-perplexity", "llama-bench", "llama-quantize"])
def test_a_tool_that_does_not_start_is_named(tmp_path: Path, broken: str) -> None:
    scripts = dict(WORKING)
    scripts[broken] = 'echo "error while loading shared libraries: libggml.so" >&2; exit 127'
    write_tools(tmp_path, scripts)
    with pytest.raises(ToolchainError, match=broken) as caught:
        find_toolchain(ToolchainSettings(llama_bin=tmp_path), {})
    assert "libggml.so" in str(caught.value)
