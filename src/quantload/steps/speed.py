"""The speed step: this machine's roofline probe, and llama-bench of one file against the limits of
the device it ran on (the CPU's probe, or the GPUs' figures)."""

from __future__ import annotations

from pathlib import Path

from quantload.config import SpeedSettings
from quantload.gpus import InventoryReader, read_gpu_inventory
from quantload.llamacpp.bench import measure_speed
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.gguf_meta import read_gguf
from quantload.progress import ProgressCallback, no_progress
from quantload.roofline.ceilings import UnknownGpuCeilings, roofline
from quantload.roofline.gpu_limits import GpuLimits, gpu_limits
from quantload.roofline.probe import MachineLimits, probe_machine
from quantload.roofline.speed_file import SpeedEntry, save_speed_entry

PROBE_DIR = "machine"  # under the cache: the probe's result, per machine, for a day


def probe(cache: Path, settings: SpeedSettings, refresh: bool = False) -> MachineLimits:
    """Memory bandwidth and arithmetic rate: a recent cached probe, else measured (about 1 s)."""
    return probe_machine(cache / PROBE_DIR, refresh=refresh, max_age_s=settings.probe_max_age_s)


def measure_file_speed(
    toolchain: Toolchain,
    model_path: Path,
    settings: SpeedSettings,
    limits: MachineLimits,
    label: str,
    progress: ProgressCallback = no_progress,
    out: Path | None = None,
    log_path: Path | None = None,
    inventory: InventoryReader = read_gpu_inventory,
) -> SpeedEntry:
    """llama-bench prefill and decode of `model_path`, placed on the roofline of the device it ran
    on: this machine's `limits` for the CPU, the GPUs' (NVML, `inventory`) for a GPU.

    With `out`, the entry is added to that speed.json under `label`.
    """
    bench = measure_speed(
        toolchain,
        model_path,
        settings.prompt_tokens,
        settings.gen_tokens,
        settings.reps,
        settings.threads,
        progress,
        timeout_s=settings.timeout_s,
        log_path=log_path,
    )
    gpus = gpu_ceilings(inventory) if "CUDA" in bench.backends.upper() else ()
    try:
        entry = SpeedEntry(bench=bench, roofline=roofline(bench, read_gguf(model_path), limits, gpus))
    except UnknownGpuCeilings as unknown:
        entry = SpeedEntry(bench=bench, roofline=None, roofline_missing=str(unknown))
    if out is not None:
        save_speed_entry(out, label, entry, limits, gpus)
    return entry


def gpu_ceilings(inventory: InventoryReader) -> tuple[GpuLimits, ...]:
    """The limits of every GPU NVML lists here that quantload can tell them for."""
    found = (gpu_limits(gpu) for gpu in inventory().gpus)
    return tuple(limits for limits in found if limits is not None)
