"""The images the compose e2e needs, made on this machine (no registry answers here), with caches.

Under `~/.cache/quantload/compose/` (quantload's cache root):
- `base-bookworm-<key>.tar`: a Debian bookworm rootfs (debootstrap, minbase, plus the packages the
  images need), trimmed of apt lists, docs and locales; `docker import`ed as BASE_IMAGE. `<key>`
  hashes the suite and package list, so changing either makes a new one.
- `wheels-<key>/`: every dependency of quantload as wheels, fetched on the host with
  `pip download` (containers have no route out), hard-linked into the build context
  (services/quantload/wheels/) for the build and removed from it afterwards.
- `debs/`: Debian's prometheus package, whose two binaries make the Prometheus stand-in.
- `context-llama/`, `context-prometheus/`: the stand-ins' build contexts.
- `last-run/`: the run folder of the last e2e (report included), `last-run.json` its wall times,
  `last-locust-ui.png` its screenshot of the Locust web UI.
- `engine-root/`: the private engine's data root, kept so that images and the classic builder's
  layer cache survive between runs (tests/e2e/test_compose_stack.py).

The stand-ins (services/standins/) are built with the Docker SDK; our own image is built by
docker-compose from services/quantload/Dockerfile, as a user builds it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import docker

from quantload.llamacpp.build import TOOL_NAMES
from quantload.llamacpp.sdist import PINNED_SDIST, source_dir
from quantload.llamacpp.toolchain import Toolchain
from quantload.paths import cache_root

REPO = Path(__file__).resolve().parents[3]
STANDINS = REPO / "services" / "standins"
WHEELS_CONTEXT = REPO / "services" / "quantload" / "wheels"
LLAMA_BUILD = f"b{PINNED_SDIST.version.split('.')[0]}"

BASE_IMAGE = "quantload-standin/debian-python:bookworm"
LLAMA_SERVER_IMAGE = f"quantload-standin/llama.cpp:server-{LLAMA_BUILD}"
LLAMA_FULL_IMAGE = f"quantload-standin/llama.cpp:full-{LLAMA_BUILD}"
PROMETHEUS_IMAGE = "quantload-standin/prometheus:debian-bookworm"
STANDIN_IMAGES = (BASE_IMAGE, LLAMA_SERVER_IMAGE, LLAMA_FULL_IMAGE, PROMETHEUS_IMAGE)

SUITE = "bookworm"
DEFAULT_MIRROR = "http://deb.debian.org/debian"
# python3-venv + python-is-python3: our image's `python -m venv`; libgomp1: llama.cpp's OpenMP;
# curl and wget: the healthchecks of the llama.cpp and Prometheus images.
BASE_PACKAGES = (
    "python3",
    "python3-venv",
    "python-is-python3",
    "ca-certificates",
    "curl",
    "wget",
    "libgomp1",
)
TRIMMED = (
    "var/cache/apt/archives",
    "var/lib/apt/lists",
    "usr/share/doc",
    "usr/share/man",
    "usr/share/locale",
)
KEY_LABEL = "org.quantload.standin-key"
BUILD_TIMEOUT_S = 900


class ImageError(Exception):
    """An image could not be made; the message names the step and shows the end of its output."""


def compose_cache(environ: Mapping[str, str]) -> Path:
    """`~/.cache/quantload/compose` (or under QUANTLOAD_CACHE_DIR)."""
    return cache_root(None, environ) / "compose"


def _key(*parts: object) -> str:
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:12]


def _run(command: list[str], what: str, timeout_s: float, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    try:
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=timeout_s, check=False, **kwargs
        )
    except subprocess.TimeoutExpired:
        raise ImageError(
            f"{what}: no result within {timeout_s:.0f} s ({' '.join(command[:3])} ...)"
        ) from None
    if result.returncode != 0:
        output = (result.stdout + result.stderr).strip().splitlines()[-25:]
        raise ImageError(f"{what} failed (exit {result.returncode}):\n" + "\n".join(output))
    return result


def _unmount_under(root: Path) -> None:
    """Lazily unmount whatever is still mounted under `root`: debootstrap mounts /proc (and /sys)
    in its target, and an interrupted or failed run leaves them there, so the folder could not be
    removed (it was found so after a CI run was stopped mid-debootstrap)."""
    prefix = f"{root.resolve()}/"
    points = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines() if line.strip()]
    for point in sorted((p for p in points if f"{p}/".startswith(prefix)), key=len, reverse=True):
        subprocess.run(["umount", "-l", point], capture_output=True, check=False, timeout=30)


# ---------------------------------------------------------------- the base image


def base_key() -> str:
    return _key(SUITE, BASE_PACKAGES, TRIMMED)


def base_rootfs_tarball(cache: Path, environ: Mapping[str, str]) -> tuple[Path, bool]:
    """The trimmed rootfs tarball, made with debootstrap when not cached: (path, was cached)."""
    tarball = cache / f"base-{SUITE}-{base_key()}.tar"
    if tarball.is_file():
        return tarball, True
    debootstrap = shutil.which("debootstrap")
    if debootstrap is None:
        raise ImageError("debootstrap is not installed (apt-get install debootstrap)")
    mirror = environ.get("QUANTLOAD_TEST_DEBIAN_MIRROR", DEFAULT_MIRROR)
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".rootfs-") as tmp:
        rootfs = Path(tmp) / "rootfs"
        try:
            _run(
                [debootstrap, "--variant=minbase", f"--include={','.join(BASE_PACKAGES)}", SUITE, str(rootfs), mirror],
                f"debootstrap {SUITE} from {mirror}", 900,
            )  # fmt: skip
        finally:
            _unmount_under(rootfs)
        for relative in TRIMMED:
            folder = rootfs / relative
            if folder.is_dir():
                for child in folder.iterdir():
                    if child.is_dir() and not child.is_symlink():
                        shutil.rmtree(child)
                    else:
                        child.unlink()
        for host_file in ("etc/hostname", "etc/resolv.conf"):  # the engine provides its own
            with contextlib.suppress(FileNotFoundError):
                (rootfs / host_file).unlink()
        partial = Path(tmp) / "rootfs.tar"
        _run(
            ["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."], "tar of the rootfs", 300
        )
        partial.replace(tarball)
    for stale in cache.glob(f"base-{SUITE}-*.tar"):  # an older package list's
        if stale != tarball:
            stale.unlink()
    return tarball, False


def _image_key(client: Any, name: str) -> str | None:
    try:
        image = client.images.get(name)
    except docker.errors.NotFound:
        return None
    labels = (image.attrs.get("Config") or {}).get("Labels") or {}
    return labels.get(KEY_LABEL)


def ensure_base_image(client: Any, tarball: Path) -> bool:
    """Import the rootfs as BASE_IMAGE unless the engine has this very one; True if it had."""
    key = base_key()
    if _image_key(client, BASE_IMAGE) == key:
        return True
    repository, tag = BASE_IMAGE.split(":")
    client.api.import_image_from_file(
        str(tarball), repository=repository, tag=tag,
        changes=[f"LABEL {KEY_LABEL}={key}", "ENV LANG=C.UTF-8", 'CMD ["bash"]'],
    )  # fmt: skip
    if _image_key(client, BASE_IMAGE) != key:
        raise ImageError(f"docker import of {tarball} did not produce {BASE_IMAGE}")
    return False


# ---------------------------------------------------------------- wheels


def _requirements() -> list[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    return sorted([*project["build-system"]["requires"], *project["project"]["dependencies"]])


def ensure_wheels(cache: Path) -> tuple[Path, bool]:
    """Every wheel the image's `pip install .` needs, fetched once: (folder, was cached).

    Fetched for this interpreter, which must be the base image's Python minor version (3.11).
    """
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    folder = cache / f"wheels-{_key(_requirements(), tag, os.uname().machine)}"
    done = folder / ".complete"
    if done.is_file():
        return folder, True
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix=".wheels-") as tmp:
        _run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--only-binary=:all:", "--dest", tmp,
             *_requirements()],
            "pip download of quantload's dependencies", 900,
        )  # fmt: skip
        (Path(tmp) / ".complete").write_text("\n".join(_requirements()) + "\n")
        if folder.exists():
            shutil.rmtree(folder)
        Path(tmp).rename(folder)
        Path(tmp).mkdir()  # for TemporaryDirectory's own clean-up
    for stale in cache.glob("wheels-*"):  # for older dependency pins
        if stale != folder and stale.is_dir():
            shutil.rmtree(stale)
    return folder, False


@contextlib.contextmanager
def wheels_in_context(wheels: Path) -> Iterator[int]:
    """The wheels linked into services/quantload/wheels/ for the build, removed afterwards."""
    placed: list[Path] = []
    try:
        for wheel in sorted(wheels.glob("*.whl")):
            target = WHEELS_CONTEXT / wheel.name
            with contextlib.suppress(FileNotFoundError):
                target.unlink()
            try:
                os.link(wheel, target)
            except OSError:
                shutil.copy2(wheel, target)
            placed.append(target)
        yield len(placed)
    finally:
        for target in placed:
            with contextlib.suppress(FileNotFoundError):
                target.unlink()


# ---------------------------------------------------------------- stand-in build contexts


def llama_context(cache: Path, toolchain: Toolchain, environ: Mapping[str, str]) -> Path:
    """app/ with the pinned build's four tools and upstream's tools.sh, plus the Dockerfile."""
    if toolchain.origin != "cache" or toolchain.sdist != PINNED_SDIST.requirement:
        raise ImageError(
            f"the llama.cpp stand-in must carry the pinned build ({PINNED_SDIST.requirement}), but the"
            f" tools found come from {toolchain.origin} ({toolchain.label}): unset QUANTLOAD_LLAMA_BIN"
            " and run 'quantload toolchain'"
        )
    context = cache / "context-llama"
    app = context / "app"
    app.mkdir(parents=True, exist_ok=True)
    for name in TOOL_NAMES:
        shutil.copy2(toolchain.path(name), app / name)
    tools_sh = source_dir(cache_root(None, environ)) / ".devops" / "tools.sh"
    shutil.copy2(tools_sh, app / "tools.sh")
    (app / "tools.sh").chmod(0o755)
    shutil.copy2(STANDINS / "llama.cpp" / "Dockerfile", context / "Dockerfile")
    return context


def prometheus_context(cache: Path) -> Path:
    """bin/prometheus and bin/promtool from Debian's package (apt-get download), plus the Dockerfile."""
    context = cache / "context-prometheus"
    binaries = context / "bin"
    if not all((binaries / name).is_file() for name in ("prometheus", "promtool")):
        debs = cache / "debs"
        debs.mkdir(parents=True, exist_ok=True)
        found = sorted(debs.glob("prometheus_*.deb"))
        if not found:
            _run(["apt-get", "download", "prometheus"], "apt-get download prometheus (run apt-get update?)", 300,
                 cwd=debs)  # fmt: skip
            found = sorted(debs.glob("prometheus_*.deb"))
        with tempfile.TemporaryDirectory(dir=cache, prefix=".deb-") as tmp:
            _run(["dpkg-deb", "-x", str(found[-1]), tmp], f"dpkg-deb -x {found[-1].name}", 120)
            binaries.mkdir(parents=True, exist_ok=True)
            for name in ("prometheus", "promtool"):
                shutil.copy2(Path(tmp) / "usr" / "bin" / name, binaries / name)
    shutil.copy2(STANDINS / "prometheus" / "Dockerfile", context / "Dockerfile")
    return context


def build_image(client: Any, context: Path, tag: str, target: str | None = None) -> str:
    """`docker build` through the SDK (classic builder, layer cache); the image id. ImageError on failure."""
    output: list[str] = []
    image_id = ""
    for chunk in client.api.build(
        path=str(context), tag=tag, target=target, buildargs={"BASE_IMAGE": BASE_IMAGE},
        rm=True, forcerm=True, decode=True, timeout=BUILD_TIMEOUT_S,
    ):  # fmt: skip
        if "stream" in chunk:
            output.extend(chunk["stream"].splitlines())
        if "aux" in chunk and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
        if "error" in chunk:
            raise ImageError(f"building {tag} failed: {chunk['error']}\n" + "\n".join(output[-25:]))
    if not image_id:
        raise ImageError(f"building {tag} gave no image:\n" + "\n".join(output[-25:]))
    return image_id
