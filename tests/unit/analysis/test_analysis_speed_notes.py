"""The warning that llama-bench shared a busy machine."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from quantload.analysis.roofline_table import busy_machine_note
from quantload.roofline.speed_file import SpeedFile


def speeds(*loads: tuple[float | None, float | None, int]) -> SpeedFile:
    results: dict[str, Any] = {
        f"q{i}": SimpleNamespace(
            bench=SimpleNamespace(load_average_1m_start=a, load_average_1m_end=b, usable_cpus=c)
        )
        for i, (a, b, c) in enumerate(loads)
    }
    return cast(SpeedFile, SimpleNamespace(results=results))


def test_busy_when_the_load_average_passes_half_a_task_per_cpu() -> None:
    note = busy_machine_note(speeds((0.2, 0.4, 2), (3.0, 4.2, 2)))
    assert note is not None and "up to 4.2 on 2 CPUs" in note
    assert busy_machine_note(speeds((0.5, 0.9, 2))) is None
    assert busy_machine_note(speeds((None, None, 2))) is None
    assert busy_machine_note(None) is None
