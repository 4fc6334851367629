"""The llama.cpp build's progress as its own count, '[N/M]', with an ETA from that count.

Run through the real `run_logged` (guard, pipe and parser) on a small CMake project built by ninja:
tests/integration/test_build_progress_processes.py.
"""

from __future__ import annotations

import pytest

from quantload.llamacpp.build import StepClock


def test_the_step_clock_counts_and_estimates_from_the_steps_so_far(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([100.0, 110.0, 130.0, 131.0])
    monkeypatch.setattr("quantload.llamacpp.build.time.monotonic", lambda: next(clock))
    steps = StepClock()
    assert steps.note(1, 222) == "[1/222]"  # no step timed yet: no ETA to invent
    assert steps.note(11, 222) == "[11/222] eta 3m31s"  # 10 steps in 10 s: 211 left
    assert steps.note(21, 222) == "[21/222] eta 5m02s"  # 20 steps in 30 s: 1.5 s each, 201 left
    assert steps.note(2, 3) == "[2/3]"  # a new count (its total changed) starts its own clock
