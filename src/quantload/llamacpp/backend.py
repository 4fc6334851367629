"""Which backend llama.cpp is built for (the CPU, or CUDA for the GPUs found), and its CMake flags.

`toolchain.backend = auto` builds CUDA where NVML lists an NVIDIA GPU and the CUDA compiler
(`nvcc`: CUDACXX, PATH or /usr/local/cuda/bin) is there, for the architectures of those GPUs only
(each GPU's compute capability: 9.0 builds `90`), not llama.cpp's list of every architecture; else
the CPU, saying why. `cpu` and `cuda` force one. The backend, its architectures and the user's extra
`toolchain.cmake_flags` make the build's cache key: each combination is built in a folder of its own,
and the plain CPU build keeps the folder it always had.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from quantload.errors import ToolchainError
from quantload.gpus import GpuInventory

BackendName = Literal["cpu", "cuda"]
CUDA_HOME_NVCC = Path("/usr/local/cuda/bin/nvcc")
CUDA_INSTALL_HINT = (
    "install the CUDA toolkit (Debian/Ubuntu: NVIDIA's apt repository, then 'sudo apt-get install"
    " -y cuda-toolkit'), or set CUDACXX to the path of nvcc"
)


@dataclass(frozen=True)
class BuildBackend:
    """What llama.cpp is built for, why, and the CMake flags that say it."""

    name: BackendName
    reason: str
    cuda_architectures: tuple[str, ...] = ()
    nvcc: Path | None = None
    extra_flags: tuple[str, ...] = ()

    def cmake_flags(self) -> tuple[str, ...]:
        """The flags this backend adds to the project's own (the user's extra flags last)."""
        flags: list[str] = []
        if self.name == "cuda":
            flags += ["-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={';'.join(self.cuda_architectures)}"]
            if self.nvcc is not None:
                flags.append(f"-DCMAKE_CUDA_COMPILER={self.nvcc}")
                root = toolkit_root(self.nvcc)
                if root is not None:  # cuBLAS and the runtime from the same toolkit as nvcc
                    flags.append(f"-DCUDAToolkit_ROOT={root}")
        return (*flags, *self.extra_flags)

    @property
    def cache_key(self) -> str:
        """The build folder's name: `build` for the plain CPU build (the folder it always had),
        else the backend, its architectures and a hash of every flag, e.g. `build-cuda-90-1f2e3d4c`."""
        flags = self.cmake_flags()
        if not flags:
            return "build"
        digest = hashlib.sha256("\n".join(flags).encode()).hexdigest()[:8]
        arch = "-" + "_".join(self.cuda_architectures) if self.cuda_architectures else ""
        return f"build-{self.name}{arch}-{digest}"

    @property
    def offloads(self) -> bool:
        """Whether tools built for this backend can put layers on a GPU."""
        return self.name != "cpu"

    def record(self) -> dict[str, object]:
        """What the build marker and every result file say about the backend."""
        return {"name": self.name, "reason": self.reason, "cuda_architectures": list(self.cuda_architectures)}


def toolkit_root(nvcc: Path) -> Path | None:
    """The CUDA toolkit `nvcc` belongs to (`<root>/bin/nvcc` beside `<root>/include`), or None
    for an nvcc elsewhere (a wrapper script), whose toolkit CMake then looks for itself."""
    root = nvcc.parent.parent
    headers = [root / "include", *sorted(root.glob("targets/*/include"))]
    return root if any((folder / "cuda_runtime.h").is_file() for folder in headers) else None


def find_nvcc(environ: Mapping[str, str], fallback: Path = CUDA_HOME_NVCC) -> Path | None:
    """The CUDA compiler: CUDACXX, then nvcc on PATH, then /usr/local/cuda/bin/nvcc."""
    configured = environ.get("CUDACXX")
    if configured:
        return Path(configured) if os.access(configured, os.X_OK) else None
    found = shutil.which("nvcc", path=environ.get("PATH", ""))
    if found:
        return Path(found)
    return fallback if os.access(fallback, os.X_OK) else None


def _architectures(configured: Sequence[str], gpus: GpuInventory) -> tuple[tuple[str, ...], str]:
    if configured:
        return tuple(configured), f"toolchain.cuda_architectures = {', '.join(configured)}"
    found = gpus.cuda_architectures()
    names = ", ".join(f"{g.name} (compute capability {g.cuda_architecture})" for g in gpus.gpus)
    return found, f"the GPUs found: {names}"


def choose_backend(
    requested: Literal["auto", "cpu", "cuda"],
    gpus: GpuInventory,
    nvcc: Path | None,
    cuda_architectures: Sequence[str] = (),
    extra_flags: Sequence[str] = (),
) -> BuildBackend:
    """The backend to build, from the setting, the GPUs NVML lists and the compiler (`find_nvcc`).

    `cuda` without nvcc, or without architectures to build for (no GPU found and none set), is a
    ToolchainError naming the fix; `auto` falls back to the CPU and says why.
    """
    extra = tuple(extra_flags)
    if requested == "cpu":
        return BuildBackend("cpu", "toolchain.backend = cpu", extra_flags=extra)
    architectures, where = _architectures(cuda_architectures, gpus)
    if requested == "cuda":
        if nvcc is None:
            raise ToolchainError("toolchain.backend = cuda, but no nvcc was found", CUDA_INSTALL_HINT)
        if not architectures:
            raise ToolchainError(
                "toolchain.backend = cuda, but no GPU architecture to build for"
                f" ({gpus.why_none or 'NVML told none'})",
                "set toolchain.cuda_architectures to the compute capability of the target GPU, e.g. ['90']"
                " for an H100",
            )
        why = f"toolchain.backend = cuda; architectures from {where}"
        return BuildBackend("cuda", why, architectures, nvcc, extra)
    if not gpus.gpus:
        return BuildBackend("cpu", f"no NVIDIA GPU found ({gpus.why_none})", extra_flags=extra)
    if nvcc is None:
        return BuildBackend(
            "cpu",
            f"an NVIDIA GPU is here but no nvcc, so llama.cpp is built for the CPU; {CUDA_INSTALL_HINT}",
            extra_flags=extra,
        )
    if not architectures:
        why = "NVML did not tell the GPUs' compute capability; set toolchain.cuda_architectures"
        return BuildBackend("cpu", why, extra_flags=extra)
    why = f"auto: nvcc at {nvcc}; architectures from {where}"
    return BuildBackend("cuda", why, architectures, nvcc, extra)
