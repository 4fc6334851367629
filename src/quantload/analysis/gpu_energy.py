"""GPU energy per output token and per request, per quantization, from the exporter's NVML series.

A quantization's load window runs from the first request sent to it to the last one's end (from
the records, warm-ups and failures included: the GPU spent energy on them too). Its energy is the
increase of `quantload_gpu_energy_joules_total` over that window, summed over every GPU the
exporter saw; a GPU without an energy counter falls back to its mean power x the window. It is
divided by the output tokens (`completion_tokens`) and the requests of that window's records.

The figure is the whole GPUs' energy: servers idling on the same GPUs during the window are in it.
Windows of two quantizations that overlap (servers loaded at once) cannot be told apart, and say so.
Where Prometheus holds no GPU series (no NVML or no GPU where the exporter ran), the result is
one gap line, not an error.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from quantload.analysis.run_data import Gap
from quantload.exporter import names
from quantload.observe.promql import PrometheusClient

SECTION = "gpu"
WHAT = "GPU energy per output token and per request"
ENERGY = names.GPU_ENERGY.name
POWER = names.GPU_POWER.name
GPU_SERIES = (names.GPU_POWER, names.GPU_ENERGY, names.GPU_UTILIZATION_RATIO, names.GPU_MEMORY_USED)
NO_GPU_WHY = (
    "Prometheus holds no quantload_gpu_* series of this run: the exporter found no NVML or no GPU on"
    " the machine it ran on"
)
NO_GPU_HOW = (
    "run the exporter where the GPU is (NVIDIA driver installed; in a container, the NVIDIA runtime"
    " with the utility capability) and it adds them"
)
COLUMNS = [
    "quant",
    "window_s",
    "gpus",
    "energy_j",
    "mean_power_w",
    "requests",
    "output_tokens",
    "j_per_output_token",
    "j_per_request",
    "source",
]


@dataclass(frozen=True)
class LoadWindow:
    """The span of one quantization's requests, and what they produced."""

    quant: str
    start_unix_s: float
    end_unix_s: float
    requests: int
    output_tokens: int

    @property
    def length_s(self) -> float:
        return self.end_unix_s - self.start_unix_s

    def overlaps(self, other: LoadWindow) -> bool:
        return self.start_unix_s < other.end_unix_s and other.start_unix_s < self.end_unix_s


def load_windows(records: pd.DataFrame, quants: Sequence[str]) -> list[LoadWindow]:
    """One window per quantization that has records with a send time."""
    if records.empty or "sent_unix_s" not in records:
        return []
    windows = []
    for quant in quants:
        mine = records[(records["quant"] == quant) & records["sent_unix_s"].notna()]
        if mine.empty:
            continue
        sent = mine["sent_unix_s"].astype(float)
        ends = sent + mine["e2e_s"].astype(float).fillna(0.0) if "e2e_s" in mine else sent
        tokens = mine["completion_tokens"].fillna(0).astype(int).sum() if "completion_tokens" in mine else 0
        windows.append(LoadWindow(quant, float(sent.min()), float(ends.max()), len(mine), int(tokens)))
    return windows


def _number(client: PrometheusClient, expr: str, at: float) -> float | None:
    found = client.query(expr, at=at)
    if not found or not found[0].has_number():
        return None
    value = found[0].values()[-1]
    return value if math.isfinite(value) else None


def _range(seconds: float) -> str:
    return f"[{max(1000, round(seconds * 1000))}ms]"


def has_gpu_series(client: PrometheusClient, start_unix_s: float, end_unix_s: float) -> bool:
    """Whether any quantload_gpu_* series was scraped between the two instants."""
    span = _range(end_unix_s - start_unix_s)
    # one metric at a time: a range function drops the name, so two metrics of one GPU would collide
    expr = " or ".join(f"count(last_over_time({spec.name}{span}))" for spec in GPU_SERIES)
    return bool(_number(client, expr, end_unix_s))


def _energy(client: PrometheusClient, window: LoadWindow) -> tuple[float, int, str] | None:
    """(joules, GPUs, how) over the window: the counter's increase, else mean power x time."""
    span, at = _range(window.length_s), window.end_unix_s
    counted = _number(client, f"count(last_over_time({ENERGY}{span}))", at) or 0.0
    powered = _number(client, f"count(last_over_time({POWER}{span}))", at) or 0.0
    if counted and counted >= powered:  # every GPU has the counter
        joules = _number(client, f"sum(increase({ENERGY}{span}))", at)
        if joules is not None:
            return joules, int(counted), "energy counter"
    watts = _number(client, f"sum(avg_over_time({POWER}{span}))", at)
    if powered and watts is not None:
        return watts * window.length_s, int(powered), "mean power x time"
    return None


def gpu_energy_table(
    client: PrometheusClient, records: pd.DataFrame, quants: Sequence[str]
) -> tuple[pd.DataFrame, list[Gap]]:
    """One row per quantization whose energy could be told (COLUMNS), and a gap for the rest."""
    windows = load_windows(records, quants)
    if not windows:
        return pd.DataFrame(columns=COLUMNS), []
    first, last = min(w.start_unix_s for w in windows), max(w.end_unix_s for w in windows)
    if not has_gpu_series(client, first, last):
        return pd.DataFrame(columns=COLUMNS), [Gap(SECTION, WHAT, NO_GPU_WHY, NO_GPU_HOW)]
    rows, gaps = [], []
    for window in windows:
        shared = [other.quant for other in windows if other is not window and window.overlaps(other)]
        if shared:
            why = f"its load overlapped that of {', '.join(shared)}, so the GPUs' energy cannot be split"
            gaps.append(Gap(SECTION, f"{WHAT} of {window.quant}", why))
            continue
        measured = _energy(client, window)
        if measured is None:
            why = "Prometheus has fewer than two GPU samples inside its load window"
            gaps.append(Gap(SECTION, f"{WHAT} of {window.quant}", why))
            continue
        joules, gpus, how = measured
        rows.append(
            {
                "quant": window.quant,
                "window_s": window.length_s,
                "gpus": gpus,
                "energy_j": joules,
                "mean_power_w": joules / window.length_s if window.length_s > 0 else None,
                "requests": window.requests,
                "output_tokens": window.output_tokens,
                "j_per_output_token": joules / window.output_tokens if window.output_tokens else None,
                "j_per_request": joules / window.requests if window.requests else None,
                "source": how,
            }
        )
    return pd.DataFrame(rows, columns=COLUMNS), gaps
