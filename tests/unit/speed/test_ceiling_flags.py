"""A ceiling is flagged, not read as one, when it moved between two probes by more than either
probe's own noise, or when a measured rate went above it (no "125 % of the ceiling")."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
from speed_helpers import limits

from quantload.analysis.chapters.model_files import _of_ceiling, roofline_flags
from quantload.roofline.probe import MachineLimits, probe_machine


def _noisy(bandwidth: float, flops: float, spread: float) -> MachineLimits:
    """A probe whose passes spread by `spread` around its medians."""
    made = limits(bandwidth, flops)
    return made.model_copy(update={
        "bandwidth_samples_bytes_per_s": [bandwidth * (1 - spread / 2), bandwidth, bandwidth * (1 + spread / 2)],
        "arithmetic_samples_flops_per_s": [flops * (1 - spread / 2), flops, flops * (1 + spread / 2)],
    })  # fmt: skip


def test_a_ceiling_that_moves_beyond_its_noise_between_probes_is_said(tmp_path: Path) -> None:
    probe_machine(tmp_path, probe=lambda: _noisy(10e9, 73.2e9, 0.05))
    again = probe_machine(tmp_path, refresh=True, probe=lambda: _noisy(10.2e9, 155.0e9, 0.05))
    assert again.earlier is not None and again.earlier.arithmetic_flops_per_s == 73.2e9
    (moved,) = again.moves()  # the bandwidth moved 2 %, within its 5 % noise
    assert moved.startswith("the arithmetic rate ceiling moved from 73.2 to 155.0 GFLOP/s since the probe of")
    assert "(112 %, more than its noise of 5 %)" in moved
    calm = probe_machine(tmp_path, refresh=True, probe=lambda: _noisy(10.1e9, 150.0e9, 0.05))
    assert calm.moves() == []  # 3 % from the probe before: noise


def test_a_rate_above_its_ceiling_is_flagged_not_shown_as_a_share_over_100_percent() -> None:
    assert _of_ceiling(0.62) == "62 %" and _of_ceiling(1.25) == "above it ⚠"

    class Run:
        speed = None

    class Seen:
        run = Run()
        roofline = pd.DataFrame([
            {"quant": "Q8_0", "test": "decode", "measured_tok_s": 177.2, "ceiling_tok_s": 141.8, "bound": "compute",
             "fraction_of_ceiling": 1.25},
            {"quant": "F16", "test": "decode", "measured_tok_s": 127.2, "ceiling_tok_s": 180.0, "bound": "memory",
             "fraction_of_ceiling": 0.71},
        ])  # fmt: skip

    (warning,) = roofline_flags(Seen())  # type: ignore[arg-type]
    (line,) = warning.items  # type: ignore[attr-defined]
    assert line.startswith("Q8_0 decode ran at 177.2 tok/s, above its compute ceiling of 141.8 tok/s (125 %)")
    assert "`quantload speed --reprobe`" in line
