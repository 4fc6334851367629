"""The quality step: perplexity of one file on the WikiText-2 test text, filed in quality.json."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from quantload.config import QualitySettings
from quantload.llamacpp.toolchain import Toolchain
from quantload.progress import ProgressCallback, no_progress
from quantload.quality.dataset import resolve_dataset
from quantload.quality.measure import measure_quality
from quantload.quality.results import QualityResult, save_quality_result


def quality_text(settings: QualitySettings, cache: Path, environ: Mapping[str, str]) -> Path:
    """The text to score: the configured file, else WikiText-2 from the cache or the network.

    Raises a QuantloadError saying how to provide it when there is none (offline, no path).
    """
    return resolve_dataset(settings.dataset, cache, environ)


def measure_file_quality(
    toolchain: Toolchain,
    model_path: Path,
    text: Path,
    settings: QualitySettings,
    label: str,
    progress: ProgressCallback = no_progress,
    out: Path | None = None,
    log_path: Path | None = None,
) -> QualityResult:
    """Perplexity of `model_path`; with `out`, added to that quality.json under `label`."""
    result = measure_quality(
        toolchain,
        model_path,
        text,
        settings.ctx,
        settings.chunks,
        progress,
        threads=settings.threads,
        timeout_s=settings.timeout_s,
        log_path=log_path,
    )
    if out is not None:
        save_quality_result(out, label, result)
    return result
