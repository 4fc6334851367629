"""Building the llama.cpp tools from the pinned source tree, once, into the cache.

A build is complete when its marker is written with the flags of its backend and every target of
BUILD_TARGETS is in bin/. A cache built before a tool was added (the four tools without
llama-imatrix, or without llama-batched-bench) is completed in place: the configured tree is kept
and `cmake --build` compiles only the missing target, reusing the libraries already built. A tree
configured with other flags (before the RPC backend) is configured again from scratch, its
CMakeCache.txt removed first:
CMake keeps every value of an old cache that the new command line does not name, so a flag
dropped since would otherwise stay on. Objects whose compile command did not change are kept.
Each backend (`llamacpp.backend`: the CPU, or CUDA for some architectures, with the user's extra
flags) builds in a folder of its own beside the source tree; the plain CPU build keeps `build/`.
A build that runs past its time limit is stopped, whole.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from quantload.childproc import die_with_parent
from quantload.errors import ToolchainError
from quantload.llamacpp.backend import BuildBackend
from quantload.llamacpp.sdist import PINNED_SDIST, SdistPin
from quantload.progress import ProgressCallback, no_progress

TOOL_NAMES: tuple[str, ...] = (
    "llama-server", "llama-quantize", "llama-bench", "llama-perplexity", "llama-imatrix",
    "llama-batched-bench",
)  # fmt: skip
RPC_SERVER_TOOL = "ggml-rpc-server"  # serves this host's CPU to a llama-server elsewhere (--rpc)
BUILD_TARGETS: tuple[str, ...] = (*TOOL_NAMES, RPC_SERVER_TOOL)
BUILD_MARKER = "quantload-build.json"
CONFIGURE_RECORD = "quantload-configure.json"  # the flags the tree was configured with
GUARD_MODULE = "quantload.groupguard"
CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DLLAMA_CURL=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DGGML_NATIVE=ON",
    "-DGGML_RPC=ON",  # llama-server --rpc, and the ggml-rpc-server target
)
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")
_MAKE_PERCENT = re.compile(r"^\[\s*(\d+)%\]")
INSTALL_HINT = (
    "install a compiler and CMake: Debian/Ubuntu 'sudo apt-get install -y build-essential cmake "
    "ninja-build', macOS 'xcode-select --install && brew install cmake ninja'"
)


CPU_BACKEND = BuildBackend("cpu", "the CPU build")
DEFAULT_BUILD_TIMEOUT_S = 3 * 3600.0


def build_dir(tree: Path, backend: BuildBackend = CPU_BACKEND) -> Path:
    """The build folder of `backend` beside the source tree (`build/` for the plain CPU build)."""
    return tree.parent / backend.cache_key


def backend_flags(backend: BuildBackend = CPU_BACKEND) -> list[str]:
    """The CMake flags a build of `backend` is configured with."""
    return [*CMAKE_FLAGS, *backend.cmake_flags()]


def built_bin_dir(tree: Path, backend: BuildBackend = CPU_BACKEND) -> Path | None:
    """The folder of finished binaries, if a complete build with the current flags is recorded."""
    build = build_dir(tree, backend)
    bins = build / "bin"
    earlier = _earlier_record(build)
    if earlier is None or earlier.get("cmake_flags") != backend_flags(backend):
        return None
    if all(os.access(bins / name, os.X_OK) for name in BUILD_TARGETS):
        return bins
    return None


def configured_flags(build: Path) -> list[str] | None:
    """The flags `build` was configured with, as recorded when it was (or by its build marker);
    None when neither says."""
    for name in (CONFIGURE_RECORD, BUILD_MARKER):
        try:
            flags = json.loads((build / name).read_text()).get("cmake_flags")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(flags, list):
            return [str(flag) for flag in flags]
    return None


def read_build_record(tree: Path, backend: BuildBackend = CPU_BACKEND) -> dict[str, object]:
    """What the build marker says: sdist, flags, backend, seconds."""
    data: dict[str, object] = json.loads((build_dir(tree, backend) / BUILD_MARKER).read_text())
    return data


def _earlier_record(build: Path) -> dict[str, object] | None:
    """The marker of an earlier, smaller build in `build` (None when there is none)."""
    try:
        data = json.loads((build / BUILD_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def check_build_prerequisites() -> None:
    """Raise a ToolchainError naming the missing compiler or CMake, with the command to fix it."""
    if shutil.which("cmake") is None:
        raise ToolchainError("cmake is not installed, so llama.cpp cannot be built", INSTALL_HINT)
    if not any(shutil.which(cxx) for cxx in ("c++", "g++", "clang++")):
        raise ToolchainError("no C++ compiler found (c++, g++ or clang++)", INSTALL_HINT)


def guarded(command: list[str]) -> list[str]:
    """`command` run under `quantload.groupguard`: its whole process tree (cmake, ninja, every
    compiler job) ends when quantload does, even when quantload is killed outright."""
    return [sys.executable, "-m", GUARD_MODULE, "--", *command]


def run_logged(
    command: list[str],
    log: Path,
    on_line: ProgressCallback | None = None,
    deadline: float | None = None,
) -> None:
    """Run one build command, its output appended to `log` (and ninja's steps to `on_line`);
    ToolchainError when it fails or is still running at `deadline` (time.monotonic()). Its whole
    process tree ends with quantload (`guarded`), and is stopped at the deadline."""
    with log.open("a", encoding="utf-8") as sink:
        sink.write("$ " + " ".join(command) + "\n")
        sink.flush()
        process = subprocess.Popen(
            guarded(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            start_new_session=True, preexec_fn=die_with_parent(),
        )  # fmt: skip
        assert process.stdout is not None
        watchdog = _stop_at(process, deadline)
        steps = StepClock()
        try:
            for line in process.stdout:
                sink.write(line)
                sink.flush()
                if on_line is not None:
                    step = _NINJA_STEP.match(line) or None
                    if step:
                        done, total = int(step.group(1)), int(step.group(2))
                        on_line(done, total, steps.note(done, total))
                    elif percent := _MAKE_PERCENT.match(line):
                        on_line(int(percent.group(1)), 100, steps.note(int(percent.group(1)), 100, "%"))
            code = process.wait()
        finally:
            if watchdog is not None:
                watchdog.cancel()
            if process.poll() is None:  # interrupted: the guard stops the whole build tree
                process.terminate()
                process.wait(timeout=30)
            process.stdout.close()
    if deadline is not None and time.monotonic() >= deadline and code != 0:
        raise ToolchainError(
            "building llama.cpp ran past toolchain.build_timeout_s and was stopped",
            f"raise toolchain.build_timeout_s, or build fewer CUDA architectures; log in {log}",
        )
    if code != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-3:]
        raise ToolchainError(
            f"building llama.cpp failed (exit {code}): {' | '.join(tail)}",
            f"full log in {log}; fix the cause, then run 'quantload toolchain' again",
        )


class StepClock:
    """The build's own count as a note, '[37/222] eta 6m10s': the time per step so far (since the
    count began, or last changed its total) times the steps left."""

    def __init__(self) -> None:
        self.started = 0.0
        self.first = 0
        self.total = -1

    def note(self, done: int, total: int, unit: str = "") -> str:
        now = time.monotonic()
        if total != self.total:
            self.started, self.first, self.total = now, done, total
        shown = f"[{done}%]" if unit == "%" else f"[{done}/{total}]"
        if done <= self.first or done >= total:
            return shown
        left_s = (now - self.started) / (done - self.first) * (total - done)
        minutes, seconds = divmod(round(left_s), 60)
        return f"{shown} eta {minutes}m{seconds:02d}s" if minutes else f"{shown} eta {seconds}s"


def _stop_at(process: subprocess.Popen[str], deadline: float | None) -> threading.Timer | None:
    """A timer that ends `process` (and so, through the guard, its whole tree) at `deadline`."""
    if deadline is None:
        return None
    timer = threading.Timer(max(0.0, deadline - time.monotonic()), process.terminate)
    timer.daemon = True
    timer.start()
    return timer


def build_tools(
    tree: Path,
    jobs: int = 0,
    progress: ProgressCallback = no_progress,
    pin: SdistPin = PINNED_SDIST,
    backend: BuildBackend = CPU_BACKEND,
    timeout_s: float = DEFAULT_BUILD_TIMEOUT_S,
) -> Path:
    """Configure and build the tools for `backend`; return the bin folder. Reuses a finished
    build, and completes one that lacks a tool added since (only that target is compiled). A build
    still running after `timeout_s` is stopped (ToolchainError); what it compiled stays for the
    next try.

    A lock file serializes builds: a second process waits for the first and then reuses its work.
    """
    done = built_bin_dir(tree, backend)
    if done is not None:
        return done
    check_build_prerequisites()
    build = build_dir(tree, backend)
    build.mkdir(parents=True, exist_ok=True)
    with (build / ".quantload-build.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            progress(0, None, "waiting for another build of llama.cpp")
            fcntl.flock(lock, fcntl.LOCK_EX)
        done = built_bin_dir(tree, backend)
        if done is not None:
            return done
        deadline = time.monotonic() + timeout_s
        return _build_locked(tree, build, jobs, progress, pin, backend, deadline)


def _build_locked(
    tree: Path,
    build: Path,
    jobs: int,
    progress: ProgressCallback,
    pin: SdistPin,
    backend: BuildBackend,
    deadline: float,
) -> Path:
    log = build / "quantload-build.log"
    started = time.monotonic()
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    flags = backend_flags(backend)
    cache = build / "CMakeCache.txt"
    reconfigured = cache.is_file() and configured_flags(build) != flags
    if reconfigured:  # configured with other flags: a fresh cache, or old values would stay
        cache.unlink()
    if not cache.is_file():
        progress(0, None, f"configuring ({backend.name})")
        (build / CONFIGURE_RECORD).unlink(missing_ok=True)
        run_logged(["cmake", "-S", str(tree), "-B", str(build), *generator, *flags], log, deadline=deadline)
        (build / CONFIGURE_RECORD).write_text(json.dumps({"cmake_flags": flags}) + "\n")
    n_jobs = jobs or os.cpu_count() or 1
    run_logged(
        ["cmake", "--build", str(build), "-j", str(n_jobs), "--target", *BUILD_TARGETS],
        log,
        on_line=progress,
        deadline=deadline,
    )
    earlier = _earlier_record(build)
    record = {
        "sdist": pin.requirement,
        "targets": list(BUILD_TARGETS),
        "cmake_flags": flags,
        "backend": backend.record(),
        "jobs": n_jobs,
        "build_seconds": round(time.monotonic() - started, 1),
    }
    if earlier is not None and reconfigured:  # rebuilt with other flags
        record["reconfigured_from"] = earlier
    elif earlier is not None:  # an earlier build completed with the targets it lacked
        record["completed_from"] = earlier
    (build / BUILD_MARKER).write_text(json.dumps(record, indent=2) + "\n")
    bins = built_bin_dir(tree, backend)
    if bins is None:
        raise ToolchainError(f"the build finished but {build / 'bin'} lacks a tool", f"see {log}")
    return bins
