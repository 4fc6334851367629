"""GPU energy per output token and per request, per quantization: only the GPUs its server used.

A quantization's load window runs from the first request sent to it to the last one's end (from
the records, warm-ups and failures included: the GPU spent energy on them too). Its GPUs are those
the exporter's `quantload_server_gpu_info` series name for its server (its log's PCI addresses
matched to NVML's GPUs, or the target's `gpus=`); its energy is the increase of
`quantload_gpu_energy_joules_total` over the window summed over those GPUs alone (a GPU without an
energy counter falls back to its mean power x the window), divided by the window's output tokens
(`completion_tokens`) and requests.

Where the run measured the GPUs idle before the load (gpu.json's idle windows), their mean idle
power x the window is the part of the energy the servers would have drawn doing nothing; the rest
is the load's own energy, given per token and request beside the total.

No number where it would mislead, one gap line instead: a server that ran on the CPU (it
offloaded no layer, or its llama.cpp has no GPU backend: no GPU energy is its); GPUs that are not
known; a GPU split into MIG slices (NVML's power and energy are the whole card's, every slice's);
two quantizations loaded at once on a shared GPU. Where Prometheus holds no GPU series at all (no
NVML or no GPU where the exporter ran), the whole table is one gap line.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from quantload.analysis.run_data import Gap
from quantload.exporter import names
from quantload.observe.promql import PrometheusClient
from quantload.rundir.gpu_file import GpuFile, IdleWindow, load_gpu_file
from quantload.rundir.handle import RunDir

SECTION = "gpu"
WHAT = "GPU energy per output token and per request"
ENERGY = names.GPU_ENERGY.name
POWER = names.GPU_POWER.name
SERVER_GPUS = names.SERVER_GPU_INFO.name
OFFLOADED = names.SERVER_OFFLOADED_LAYERS.name
GPU_SERIES = (names.GPU_POWER, names.GPU_ENERGY, names.GPU_UTILIZATION_RATIO, names.GPU_MEMORY_USED)
NO_GPU_WHY = (
    "Prometheus holds no quantload_gpu_* series of this run: the exporter found no NVML or no GPU on"
    " the machine it ran on"
)
NO_GPU_HOW = (
    "run the exporter where the GPU is (NVIDIA driver installed; in a container, the NVIDIA runtime"
    " with the utility capability) and it adds them"
)
UNKNOWN_GPUS_HOW = (
    "give the exporter the server's log (target option log=PATH) or its GPUs (gpus=INDEX or UUID)"
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
    "idle_power_w",
    "load_energy_j",
    "load_j_per_output_token",
    "load_j_per_request",
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


@dataclass(frozen=True)
class ServerGpus:
    """The GPUs one quantization's server used during its window, as the exporter named them."""

    uuids: tuple[str, ...]
    mig: bool
    offloaded_layers: int | None  # None: its log's count is not known

    def selector(self) -> str:
        """A PromQL label matcher for exactly these GPUs."""
        return 'uuid=~"' + "|".join(_escaped(uuid) for uuid in self.uuids) + '"'


def read_gpu_file(run_dir: Path) -> GpuFile | None:
    """The run's gpu.json, or None where there is none (or it cannot be read)."""
    path = RunDir(run_dir).gpu_path
    if not path.is_file():
        return None
    try:
        return load_gpu_file(path)
    except (OSError, ValueError):
        return None


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


def _escaped(text: str) -> str:
    """`text` as a literal inside a PromQL regular expression in double quotes."""
    special = set(".^$*+?()[]{}|\\")
    return "".join(f"\\\\{c}" if c in special else c for c in text).replace('"', '\\"')


def _label(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"')


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


def server_gpus(client: PrometheusClient, window: LoadWindow) -> ServerGpus:
    """The GPUs the exporter saw `window`'s server on, and the layers it offloaded."""
    span, at = _range(window.length_s), window.end_unix_s
    quant = _label(window.quant)
    expr = f'max by (uuid, mig) (last_over_time({SERVER_GPUS}{{quant="{quant}"}}{span}))'
    found = client.query(expr, at=at)
    uuids = sorted({str(series.labels.get("uuid", "")) for series in found} - {""})
    mig = any(series.labels.get("mig") == "yes" for series in found)
    offloaded = _number(client, f'max(last_over_time({OFFLOADED}{{quant="{quant}"}}{span}))', at)
    return ServerGpus(tuple(uuids), mig, int(offloaded) if offloaded is not None else None)


def _energy(client: PrometheusClient, window: LoadWindow, gpus: ServerGpus) -> tuple[float, int, str] | None:
    """(joules, GPUs, how) over the window: the counters' increase, else mean power x time."""
    span, at, only = _range(window.length_s), window.end_unix_s, gpus.selector()
    counted = _number(client, f"count(last_over_time({ENERGY}{{{only}}}{span}))", at) or 0.0
    powered = _number(client, f"count(last_over_time({POWER}{{{only}}}{span}))", at) or 0.0
    if counted and counted >= powered:  # every one of its GPUs has the counter
        joules = _number(client, f"sum(increase({ENERGY}{{{only}}}{span}))", at)
        if joules is not None:
            return joules, int(counted), "energy counter"
    watts = _number(client, f"sum(avg_over_time({POWER}{{{only}}}{span}))", at)
    if powered and watts is not None:
        return watts * window.length_s, int(powered), "mean power x time"
    return None


def idle_power_w(client: PrometheusClient, idle: IdleWindow, gpus: ServerGpus) -> float | None:
    """The mean power the GPUs drew over an idle window (summed over them)."""
    expr = f"sum(avg_over_time({POWER}{{{gpus.selector()}}}{_range(idle.length_s)}))"
    return _number(client, expr, idle.end_unix_s)


def _why_no_gpus(window: LoadWindow, gpus: ServerGpus, gpu_file: GpuFile | None) -> tuple[str, str]:
    """Why a quantization has no GPU of its own, and what to do (or "" when nothing is to do)."""
    logged = gpu_file.offloaded(window.quant) if gpu_file is not None else None
    offloaded = gpus.offloaded_layers if gpus.offloaded_layers is not None else logged
    if offloaded == 0:
        return "its server ran on the CPU (it offloaded no layer): no GPU energy is its", ""
    if gpu_file is not None and window.quant in gpu_file.offload and logged is None:
        line = str(gpu_file.offload[window.quant].get("line", ""))
        return f"its server ran on the CPU ({line}): no GPU energy is its", ""
    return (
        "which GPUs its server used is not known, and the other GPUs' energy is not its",
        UNKNOWN_GPUS_HOW,
    )


def _row(
    client: PrometheusClient, window: LoadWindow, gpus: ServerGpus, gpu_file: GpuFile | None
) -> dict[str, object] | str:
    """One table row, or why there is none."""
    measured = _energy(client, window, gpus)
    if measured is None:
        return "Prometheus has fewer than two samples of its GPUs inside its load window"
    joules, count, how = measured
    idle = gpu_file.idle_before(window.quant, window.start_unix_s) if gpu_file is not None else None
    idle_w = idle_power_w(client, idle, gpus) if idle is not None else None
    load_j = joules - idle_w * window.length_s if idle_w is not None else None

    def per(total: float | None, count_of: int) -> float | None:
        return total / count_of if total is not None and count_of else None

    return {
        "quant": window.quant,
        "window_s": window.length_s,
        "gpus": count,
        "energy_j": joules,
        "mean_power_w": joules / window.length_s if window.length_s > 0 else None,
        "requests": window.requests,
        "output_tokens": window.output_tokens,
        "j_per_output_token": per(joules, window.output_tokens),
        "j_per_request": per(joules, window.requests),
        "idle_power_w": idle_w,
        "load_energy_j": load_j,
        "load_j_per_output_token": per(load_j, window.output_tokens),
        "load_j_per_request": per(load_j, window.requests),
        "source": how,
    }


def gpu_energy_table(
    client: PrometheusClient,
    records: pd.DataFrame,
    quants: Sequence[str],
    gpu_file: GpuFile | None = None,
) -> tuple[pd.DataFrame, list[Gap]]:
    """One row per quantization whose own GPUs' energy could be told (COLUMNS), a gap for the rest."""
    windows = load_windows(records, quants)
    if not windows:
        return pd.DataFrame(columns=COLUMNS), []
    first, last = min(w.start_unix_s for w in windows), max(w.end_unix_s for w in windows)
    if not has_gpu_series(client, first, last):
        return pd.DataFrame(columns=COLUMNS), [Gap(SECTION, WHAT, NO_GPU_WHY, NO_GPU_HOW)]
    owned = {window.quant: server_gpus(client, window) for window in windows}
    rows, gaps = [], []
    for window in windows:
        what = f"{WHAT} of {window.quant}"
        gpus = owned[window.quant]
        if not gpus.uuids:
            why, how = _why_no_gpus(window, gpus, gpu_file)
            gaps.append(Gap(SECTION, what, why, how))
            continue
        if gpus.mig:
            why = (
                "its server ran on a MIG slice: NVML's power and energy are the whole card's, every"
                " slice's, so the slice's own energy cannot be told"
            )
            gaps.append(Gap(SECTION, what, why))
            continue
        shared = [
            other.quant
            for other in windows
            if other is not window
            and window.overlaps(other)
            and set(gpus.uuids) & set(owned[other.quant].uuids)
        ]
        if shared:
            why = (
                f"its load overlapped that of {', '.join(shared)} on the same GPU, so its energy"
                " cannot be split"
            )
            gaps.append(Gap(SECTION, what, why))
            continue
        row = _row(client, window, gpus, gpu_file)
        if isinstance(row, str):
            gaps.append(Gap(SECTION, what, row))
            continue
        rows.append(row)
    return pd.DataFrame(rows, columns=COLUMNS), gaps
