"""The speed step: this machine's roofline probe, and llama-bench of one file against it."""

from __future__ import annotations

from pathlib import Path

from quantload.config import SpeedSettings
from quantload.llamacpp.bench import measure_speed
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.gguf_meta import read_gguf
from quantload.progress import ProgressCallback, no_progress
from quantload.roofline.ceilings import roofline
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
) -> SpeedEntry:
    """llama-bench prefill and decode of `model_path`, placed on the roofline of `limits`.

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
    entry = SpeedEntry(bench=bench, roofline=roofline(bench, read_gguf(model_path), limits))
    if out is not None:
        save_speed_entry(out, label, entry, limits)
    return entry
