"""speed.json: bench and roofline per quantization and the machine's limits, merged across runs."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from speed_helpers import bench_run, limits, write_small_gguf

from quantload.errors import ConfigError
from quantload.llamacpp.bench import measure_speed
from quantload.llamacpp.tool_run import ToolRun
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.gguf_meta import read_gguf
from quantload.roofline.ceilings import roofline
from quantload.roofline.speed_file import (
    SPEED_SCHEMA,
    SpeedEntry,
    SpeedFile,
    busy_note,
    load_speed_file,
    save_speed_entry,
)


def entry(tmp_path: Path, toolchain: Toolchain) -> SpeedEntry:
    run = bench_run("bench_ok.json", "bench_ok.stderr")

    def runner(command: list[str], on_output: Any, timeout_s: float | None) -> ToolRun:
        return run

    speed = measure_speed(toolchain, Path("m.gguf"), 64, 16, 3, 0, runner=runner)
    summary = read_gguf(write_small_gguf(tmp_path / "m.gguf"))
    return SpeedEntry(bench=speed, roofline=roofline(speed, summary, limits()))


def test_entries_merge_by_quant_and_round_trip(tmp_path: Path, fake_toolchain: Toolchain) -> None:
    path = tmp_path / "speed.json"
    one = entry(tmp_path, fake_toolchain)
    save_speed_entry(path, "Q8_0", one, limits())
    updated = save_speed_entry(path, "Q4_K_M", one, limits(bandwidth_bytes_per_s=5e9))
    data = json.loads(path.read_text())
    assert data["schema"] == SPEED_SCHEMA
    assert list(data["results"]) == ["Q8_0", "Q4_K_M"]
    assert set(data["results"]["Q8_0"]) == {"bench", "roofline", "roofline_missing"}
    assert data["machine"]["bandwidth_bytes_per_s"] == 5e9
    assert data["results"]["Q8_0"]["roofline"]["decode"]["bound"] == "memory"
    assert load_speed_file(path) == updated


def test_a_file_of_another_kind_is_not_overwritten(tmp_path: Path, fake_toolchain: Toolchain) -> None:
    path = tmp_path / "speed.json"
    path.write_text("[]")
    with pytest.raises(ConfigError, match=r"is not a quantload\.speed/1 file"):
        save_speed_entry(path, "F16", entry(tmp_path, fake_toolchain), limits())


def test_a_busy_machine_is_flagged_by_other_processes_cpu_share(tmp_path: Path, fake_toolchain: Toolchain) -> None:
    one = entry(tmp_path, fake_toolchain)

    def with_others(share: float | None) -> SpeedFile:
        bench = one.bench.model_copy(update={"other_cpu_frac": share, "load_average_1m_end": 9.0})
        return SpeedFile().with_entry("F16", one.model_copy(update={"bench": bench}), limits())

    assert busy_note(with_others(0.05)) is None  # llama-bench's own load average does not count
    assert busy_note(with_others(None)) is None
    note = busy_note(with_others(0.6))
    assert note is not None and "up to 60% of the CPUs" in note and "F16" in note
    assert busy_note(None) is None
