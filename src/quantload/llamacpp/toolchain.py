"""Finding the llama.cpp tools: a configured folder, PATH, or our own cached build.

Our own build always has every tool of TOOL_NAMES and ggml-rpc-server, built for the backend
`llamacpp.backend` chooses (CUDA for the GPUs found where nvcc is, else the CPU), each backend in a
cache folder of its own. A folder of the user's (QUANTLOAD_LLAMA_BIN, PATH) needs the four
REQUIRED_TOOLS; llama-imatrix, llama-batched-bench and ggml-rpc-server (OPTIONAL_TOOLS) are used
when they are there, and a step that needs one without it stops in one line naming the folder
(`Toolchain.path`).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from quantload.cache_lock import cache_lock
from quantload.config import ToolchainSettings
from quantload.errors import ToolchainError
from quantload.gpus import GpuInventory, InventoryReader, read_gpu_inventory
from quantload.llamacpp.backend import BuildBackend, choose_backend, find_nvcc
from quantload.llamacpp.build import (
    RPC_SERVER_TOOL,
    TOOL_NAMES,
    build_tools,
    built_bin_dir,
    read_build_record,
)
from quantload.llamacpp.offload import GpuLayers, gpu_layer_args
from quantload.llamacpp.sdist import PINNED_SDIST, ensure_source_tree, source_dir
from quantload.paths import cache_root
from quantload.progress import ProgressCallback, no_progress

Origin = Literal["QUANTLOAD_LLAMA_BIN", "PATH", "cache"]
IMATRIX_TOOL = "llama-imatrix"
BATCHED_BENCH_TOOL = "llama-batched-bench"
REQUIRED_TOOLS: tuple[str, ...] = tuple(
    name for name in TOOL_NAMES if name not in (IMATRIX_TOOL, BATCHED_BENCH_TOOL)
)
OPTIONAL_TOOLS: tuple[str, ...] = (IMATRIX_TOOL, BATCHED_BENCH_TOOL, RPC_SERVER_TOOL)


@dataclass(frozen=True)
class Toolchain:
    """The llama.cpp tools and which llama.cpp they are."""

    tools: Mapping[str, Path]
    origin: Origin
    binary_version: str
    sdist: str | None = None
    build: Mapping[str, object] = field(default_factory=dict)
    backend: BuildBackend | None = None  # our own build's; None for a folder of the user's
    gpu_layers: GpuLayers | None = None  # server.gpu_layers for the measuring tools; None: theirs

    def path(self, name: str) -> Path:
        """Path of one tool, e.g. `llama-server`; ToolchainError when this llama.cpp lacks it."""
        if name not in self.tools:
            folder = self.tools["llama-server"].parent
            raise ToolchainError(
                f"the llama.cpp tools in {folder} ({self.origin}) have no {name}",
                f"build {name} there (cmake --build BUILD --target {name}), or unset"
                " QUANTLOAD_LLAMA_BIN to let quantload build every tool it uses",
            )
        return self.tools[name]

    def layer_args(self, tool: str) -> list[str]:
        """`-ngl` for `tool` as `server.gpu_layers` says (llamacpp.offload), or nothing."""
        return gpu_layer_args(tool, self.gpu_layers)

    def placing_layers(self, gpu_layers: GpuLayers) -> Toolchain:
        """These tools, with `gpu_layers` on the GPU for every tool that loads a model."""
        return dataclasses.replace(self, gpu_layers=gpu_layers)

    def version_record(self) -> dict[str, object]:
        """What every result file records about the llama.cpp in use."""
        return {
            "origin": self.origin,
            "sdist": self.sdist,
            "binary_version": self.binary_version,
            "bin_dir": str(self.tools["llama-server"].parent),
            "backend": self.backend.record() if self.backend is not None else None,
            "gpu_layers": self.gpu_layers,
        }

    @property
    def label(self) -> str:
        """One line naming this llama.cpp, e.g. for a report header."""
        return self.sdist or self.binary_version


def binary_version(server: Path) -> str:
    """The first 'version:' line llama-server prints for --version, checking it runs at all."""
    try:
        result = subprocess.run(
            [str(server), "--version"], capture_output=True, text=True, timeout=30, check=False
        )
    except OSError as error:
        raise ToolchainError(f"{server} cannot run: {error}", "rebuild or reinstall it") from None
    text = (result.stdout + result.stderr).strip()
    lines = [line for line in text.splitlines() if line.startswith("version")]
    if result.returncode != 0 or not lines:
        raise ToolchainError(
            f"{server} --version failed (exit {result.returncode}): {text[-200:]}",
            "rebuild or reinstall llama.cpp",
        )
    return lines[0].strip()


_HELP_CHECKS: dict[str, tuple[str, str]] = {
    "llama-quantize": ("--help", "usage:"),
    RPC_SERVER_TOOL: ("--help", "Usage:"),
}


def check_tools_run(tools: Mapping[str, Path]) -> None:
    """Start every tool but llama-server (checked by `binary_version`) once, to show it runs here.

    llama-quantize has no --version: it prints its usage for --help and exits 1, which counts;
    ggml-rpc-server has none either, and prints "Usage:" for --help.
    """
    for name, path in tools.items():
        if name == "llama-server":
            continue
        flag, expected = _HELP_CHECKS.get(name, ("--version", "version"))
        try:
            result = subprocess.run(
                [str(path), flag], capture_output=True, text=True, timeout=30, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            raise ToolchainError(f"{path} cannot run: {error}", "rebuild or reinstall llama.cpp") from None
        text = (result.stdout + result.stderr).strip()
        if result.returncode < 0 or expected not in text:
            raise ToolchainError(
                f"{path} {flag} failed (exit {result.returncode}): {text[-200:] or 'no output'}",
                "rebuild or reinstall llama.cpp",
            )


def _checked(
    tools: dict[str, Path],
    origin: Origin,
    sdist: str | None = None,
    build: Mapping[str, object] | None = None,
    backend: BuildBackend | None = None,
) -> Toolchain:
    version = binary_version(tools["llama-server"])
    check_tools_run(tools)
    return Toolchain(tools, origin, version, sdist=sdist, build=build or {}, backend=backend)


def _tools_in(folder: Path) -> dict[str, Path] | None:
    found = {name: folder / name for name in TOOL_NAMES}
    if not all(os.access(p, os.X_OK) for p in found.values()):
        return None
    return _with_optional(folder, found)


def _with_optional(folder: Path, tools: dict[str, Path]) -> dict[str, Path]:
    """`tools` and each of OPTIONAL_TOOLS beside them that is there."""
    there = {name: folder / name for name in OPTIONAL_TOOLS if os.access(folder / name, os.X_OK)}
    return {**tools, **there}


def _from_configured(folder: Path) -> dict[str, Path]:
    folder = folder.expanduser()
    missing = [name for name in REQUIRED_TOOLS if not os.access(folder / name, os.X_OK)]
    if missing:
        raise ToolchainError(
            f"QUANTLOAD_LLAMA_BIN={folder} lacks {', '.join(missing)}",
            f"point it at a folder holding {', '.join(REQUIRED_TOOLS)} (and {IMATRIX_TOOL} for an"
            " importance matrix), or unset it to let quantload build them",
        )
    return _with_optional(folder, {name: folder / name for name in REQUIRED_TOOLS})


def _from_path(environ: Mapping[str, str]) -> dict[str, Path] | None:
    search = environ.get("PATH", "")
    found = {name: shutil.which(name, path=search) for name in REQUIRED_TOOLS}
    if all(found.values()):
        tools = {name: Path(p) for name, p in found.items() if p}
        optional = {name: shutil.which(name, path=search) for name in OPTIONAL_TOOLS}
        return {**tools, **{name: Path(p) for name, p in optional.items() if p}}
    return None


def cache_backend(
    settings: ToolchainSettings, environ: Mapping[str, str], gpus: InventoryReader = read_gpu_inventory
) -> BuildBackend:
    """The backend our own build is (or would be) made for on this machine."""
    if settings.backend == "cpu":  # no need to ask NVML or look for nvcc
        return choose_backend("cpu", GpuInventory(), None, (), settings.cmake_flags)
    return choose_backend(
        settings.backend, gpus(), find_nvcc(environ), settings.cuda_architectures, settings.cmake_flags
    )


def _from_cache(
    settings: ToolchainSettings, environ: Mapping[str, str], backend: BuildBackend
) -> Toolchain | None:
    tree = source_dir(cache_root(settings.cache_dir, environ))
    bins = built_bin_dir(tree, backend)
    built = _tools_in(bins) if bins is not None else None
    if built is None:
        return None
    record = read_build_record(tree, backend)
    return _checked(built, "cache", sdist=PINNED_SDIST.requirement, build=record, backend=backend)


def find_toolchain(
    settings: ToolchainSettings,
    environ: Mapping[str, str],
    gpus: InventoryReader = read_gpu_inventory,
) -> Toolchain | None:
    """The tools already available, without building anything; None if there are none."""
    if settings.llama_bin is not None:
        return _checked(_from_configured(settings.llama_bin), "QUANTLOAD_LLAMA_BIN")
    on_path = _from_path(environ)
    if on_path is not None:
        return _checked(on_path, "PATH")
    return _from_cache(settings, environ, cache_backend(settings, environ, gpus))


def ensure_toolchain(
    settings: ToolchainSettings,
    environ: Mapping[str, str],
    progress: ProgressCallback = no_progress,
    gpus: InventoryReader = read_gpu_inventory,
    gpu_layers: GpuLayers | None = None,
) -> Toolchain:
    """The tools, building them from the pinned sdist into the cache when none are found, for
    the backend this machine calls for (`cache_backend`); with `gpu_layers` (server.gpu_layers)
    every measuring tool places that many layers on the GPU. The cache's tools are looked for and
    built under the cache's lock (quantload.cache_lock), so a run never takes tools another run is
    still building."""
    chain = _ensure(settings, environ, progress, gpus)
    return chain.placing_layers(gpu_layers) if gpu_layers is not None else chain


def _ensure(
    settings: ToolchainSettings, environ: Mapping[str, str], progress: ProgressCallback, gpus: InventoryReader
) -> Toolchain:
    if settings.llama_bin is not None or _from_path(environ) is not None:
        found = find_toolchain(settings, environ, gpus)
        assert found is not None
        return found
    backend = cache_backend(settings, environ, gpus)
    found = _from_cache(settings, environ, backend)
    if found is not None:
        return found
    cache = cache_root(settings.cache_dir, environ)
    with cache_lock(_lock_folder(cache), "the llama.cpp build", on_wait=lambda line: progress(0, None, line)):
        found = _from_cache(settings, environ, backend)
        if found is not None:
            return found
        tree = ensure_source_tree(cache, local_dir=settings.sdist_dir)
        build_tools(
            tree, jobs=settings.build_jobs, progress=progress, backend=backend,
            timeout_s=settings.build_timeout_s,
        )  # fmt: skip
        built = _from_cache(settings, environ, backend)
    if built is None:
        raise ToolchainError("llama.cpp was built but its tools cannot be found", "run again")
    return built


def _lock_folder(cache: Path) -> Path:
    """The folder whose lock guards the pinned llama.cpp's source and build in `cache`."""
    return source_dir(cache).parent


def ensure_llama_source(settings: ToolchainSettings, environ: Mapping[str, str]) -> Path:
    """The pinned llama.cpp source tree (for its vocabulary files), downloaded if needed."""
    cache = cache_root(settings.cache_dir, environ)
    with cache_lock(_lock_folder(cache), "the llama.cpp source"):
        return ensure_source_tree(cache, local_dir=settings.sdist_dir)
