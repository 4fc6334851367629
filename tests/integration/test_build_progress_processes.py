"""The llama.cpp build's progress as its own count, '[N/M]', with an ETA from that count: run
through the real `run_logged` (guard, pipe and parser) on a small CMake project built by ninja
(cmake, ninja and a C++ compiler are child processes).

Moved from tests/unit/test_build_progress.py, whose other tests start no process.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from quantload.llamacpp.build import run_logged

pytestmark = pytest.mark.integration

SOURCES = 6


def test_a_ninja_build_reports_each_step_with_its_total(tmp_path: Path) -> None:
    if not (shutil.which("cmake") and shutil.which("ninja") and shutil.which("c++")):
        pytest.skip("cmake, ninja and a C++ compiler are needed (apt-get install -y cmake ninja-build g++)")
    source = tmp_path / "src"
    source.mkdir()
    names = [f"part{i}.cpp" for i in range(SOURCES)]
    for index, name in enumerate(names):
        (source / name).write_text(f"int part{index}() {{ return {index}; }}\n")
    (source / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.16)\nproject(steps CXX)\n"
        f"add_library(steps STATIC {' '.join(names)})\n"
    )
    build, log = tmp_path / "build", tmp_path / "build.log"
    run_logged(["cmake", "-S", str(source), "-B", str(build), "-G", "Ninja"], log)
    seen: list[tuple[float, float | None, str]] = []
    run_logged(
        ["cmake", "--build", str(build), "-j", "1"], log, on_line=lambda d, t, n="": seen.append((d, t, n))
    )
    assert seen, "no step reached the progress callback"
    totals = {total for _, total, _ in seen}
    assert totals == {SOURCES + 1}  # each source, then the archive
    assert [done for done, _, _ in seen] == list(range(1, SOURCES + 2))
    for done, total, note in seen:
        assert re.fullmatch(rf"\[{int(done)}/{int(total or 0)}\]( eta \d+(m\d\ds|s))?", note), note
    assert any(" eta " in note for _, _, note in seen[1:-1])
