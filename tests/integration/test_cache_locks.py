"""Two runs on one machine at once never see each other's half-written cache files: the prepared
files' manifest is written under its folder's lock and read whole (the prepare test once read it
while another run rewrote it: KeyError 'Q8_0'), a JSON file two processes write at once is always
one of them whole, two calibrations at once leave a whole latest.json, and the prepare waits for
the process writing its folder and says so."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from quantload.cache_lock import CacheBusy, cache_lock
from quantload.config import ModelSettings, ToolchainSettings
from quantload.errors import ToolchainError
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.manifest import load_manifest
from quantload.models.prepared import prepare_model_files
from quantload.rundir import read_json

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="flock and fork"),
]
READ_FOR_S = 1.2

REWRITER = """
import sys, time
from pathlib import Path
from quantload.cache_lock import cache_lock
from quantload.models.manifest import Manifest, ManifestEntry, save_manifest

folder = Path(sys.argv[1])

def entry(label):
    return ManifestEntry(quant=label, file=f"m-{label}.gguf", path=f"m-{label}.gguf", size_bytes=1000,
                         sha256="0" * 64, n_params=1, tensor_bytes=1, architecture="qwen2",
                         file_type=label, made_from="F16", seconds=0.0)

print("ready", flush=True)
deadline = time.monotonic() + float(sys.argv[2])
while time.monotonic() < deadline:
    with cache_lock(folder, "the prepared files"):  # as prepare_model_files holds it
        manifest = Manifest(source={}, llama_cpp={}, files={"F16": entry("F16")}, reference="F16")
        save_manifest(folder / "manifest.json", manifest)  # a prepare starts again from the reference
        time.sleep(0.01)
        manifest.files["Q8_0"] = entry("Q8_0")
        save_manifest(folder / "manifest.json", manifest)
    time.sleep(0.1)  # between two prepares: a reader's turn
"""

OVERWRITER = """
import sys, time
from pathlib import Path
from quantload.rundir import write_json_atomic

path, name = Path(sys.argv[1]), sys.argv[2]
print("ready", flush=True)
deadline = time.monotonic() + float(sys.argv[3])
while time.monotonic() < deadline:
    write_json_atomic(path, {"writer": name, "payload": [name] * 20000})
"""


def _start(code: str, *args: str) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code), *args], stdout=subprocess.PIPE, text=True
    )
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    return process


def _finish(processes: list[subprocess.Popen[str]]) -> None:
    for process in processes:
        assert process.wait(timeout=30) == 0


def test_the_prepared_manifest_is_read_whole_while_two_runs_rewrite_it(tmp_path: Path) -> None:
    folder = tmp_path / "prepared" / "tiny"
    writers = [_start(REWRITER, str(folder), str(READ_FOR_S)) for _ in range(2)]
    seen, partial = 0, []
    deadline = time.monotonic() + READ_FOR_S
    try:
        while time.monotonic() < deadline:
            manifest = load_manifest(folder / "manifest.json")
            if manifest is None:
                continue  # before the first write
            seen += 1
            if set(manifest.files) != {"F16", "Q8_0"}:
                partial.append(sorted(manifest.files))
    finally:
        _finish(writers)
    assert seen > 5 and partial == [], f"{len(partial)} of {seen} reads saw a manifest mid-prepare"


def test_a_json_file_two_processes_write_at_once_is_always_one_of_them_whole(tmp_path: Path) -> None:
    path = tmp_path / "shared.json"
    writers = [_start(OVERWRITER, str(path), name, str(READ_FOR_S)) for name in ("a", "b")]
    reads = 0
    deadline = time.monotonic() + READ_FOR_S
    try:
        while time.monotonic() < deadline:
            if path.exists():
                data = read_json(path)  # raises on half a file
                assert len(data["payload"]) == 20000 and set(data["payload"]) == {data["writer"]}
                reads += 1
    finally:
        _finish(writers)
    assert reads > 10
    assert not list(tmp_path.glob("*.partial"))  # no writer's temporary file is left behind


def test_a_prepare_waits_for_the_process_writing_its_folder_and_says_so(tmp_path: Path) -> None:
    folder = tmp_path / "prepared" / "tiny"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import time
            from pathlib import Path
            from quantload.cache_lock import cache_lock
            with cache_lock(Path({str(folder)!r}), "the prepared files"):
                print("ready", flush=True)
                time.sleep(1.0)
            """)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline() == "ready\n"
    said: list[str] = []
    tools = Toolchain(tools={"llama-server": tmp_path / "llama-server"}, origin="PATH", binary_version="none")
    started = time.monotonic()
    try:
        with pytest.raises(ToolchainError):  # once the folder is free: this toolchain has no llama-quantize
            prepare_model_files(
                ModelSettings(source="tiny"), ToolchainSettings(), tools, tmp_path, {}, folder,
                progress=lambda done, total, note="": said.append(note),
            )  # fmt: skip
    finally:
        holder.wait(timeout=10)
    assert time.monotonic() - started >= 0.5
    assert said and said[0] == f"waiting for process {holder.pid}, which is writing the prepared files ({folder})"


def test_a_lock_held_past_the_wait_is_one_line_naming_its_holder(tmp_path: Path) -> None:
    with cache_lock(tmp_path, "the llama.cpp build"):
        code = f"""
            from pathlib import Path
            from quantload.cache_lock import CacheBusy, cache_lock
            try:
                with cache_lock(Path({str(tmp_path)!r}), "the llama.cpp build", wait_s=0.3):
                    pass
            except CacheBusy as error:
                print(error.one_line())
            """
        done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=30)
    assert f"process {os.getpid()} has held the llama.cpp build" in done.stdout, done.stderr
    assert CacheBusy.__mro__[1].__name__ == "QuantloadError"
