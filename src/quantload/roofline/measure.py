"""The speed step of one file: llama-bench prefill and decode, placed on the roofline of the device
it ran on (this machine's probe for the CPU, the GPUs' figures for a GPU), filed in speed.json."""

from __future__ import annotations

from pathlib import Path

from quantload.config import SpeedSettings
from quantload.gpus import InventoryReader, read_gpu_inventory
from quantload.llamacpp.bench import measure_speed
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.gguf_meta import read_gguf
from quantload.progress import ProgressCallback, no_progress
from quantload.roofline.ceilings import UnknownGpuCeilings, roofline
from quantload.roofline.gpu_limits import gpu_ceilings
from quantload.roofline.probe import MachineLimits
from quantload.roofline.speed_file import SpeedEntry, save_speed_entry


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
