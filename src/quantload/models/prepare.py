"""Preparing F16, Q8_0 and Q4_K_M files of one model, idempotently.

Each file is written under a `.partial` name, checked (GGUF header, tensors within the file),
then renamed, so a final name never holds half a file. A file already listed in the manifest with
the same size and sha256 is reused; anything else under a final name is rebuilt.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from quantload.errors import ModelError
from quantload.llamacpp.quantize import quantize
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.gguf_meta import read_gguf
from quantload.models.manifest import Manifest, ManifestEntry, load_manifest, save_manifest, sha256_of
from quantload.models.sources import ResolvedSource, resolve_source
from quantload.models.synthetic import write_tiny_model
from quantload.progress import ProgressCallback, no_progress
from quantload.rundir import LOGS_DIR, MANIFEST_JSON

BASE_QUANT = "F16"


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _entry_still_valid(path: Path, entry: ManifestEntry | None, made_from: str) -> bool:
    if entry is None or entry.made_from != made_from or not path.is_file():
        return False
    return path.stat().st_size == entry.size_bytes and sha256_of(path) == entry.sha256


def _finish(
    partial: Path, target: Path, quant: str, made_from: str, started: float, made_with: str
) -> ManifestEntry:
    summary = read_gguf(partial)  # raises on a truncated or corrupt result
    partial.replace(target)
    return ManifestEntry(
        quant=quant,
        file=target.name,
        path=str(target.resolve()),
        size_bytes=summary.size_bytes,
        sha256=sha256_of(target),
        n_params=summary.n_params,
        tensor_bytes=summary.tensor_bytes,
        architecture=summary.architecture,
        file_type=summary.file_type,
        made_from=made_from,
        seconds=round(time.monotonic() - started, 2),
        made_with=made_with,
    )


def _make_base(
    resolved: ResolvedSource,
    partial: Path,
    toolchain: Toolchain,
    llama_tree: Callable[[], Path],
    tiny_seed: int,
    log_dir: Path,
    progress: ProgressCallback,
) -> None:
    if resolved.kind == "synthetic":
        write_tiny_model(llama_tree(), partial, seed=tiny_seed)
    elif resolved.base_path is None:
        raise ModelError(f"source {resolved.name} has no file")
    elif resolved.base_file_type == BASE_QUANT:
        _link_or_copy(resolved.base_path, partial)
    else:
        quantize(
            toolchain, resolved.base_path, partial, BASE_QUANT, log_dir / f"quantize-{BASE_QUANT}.log",
            allow_requantize=resolved.base_file_type not in ("F32", "BF16"), progress=progress,
        )


class _StepProgress:
    """Progress of one file, reported as a fraction of all files."""

    def __init__(self, overall: ProgressCallback, index: int, steps: int, quant: str) -> None:
        self.overall, self.index, self.steps, self.quant = overall, index, steps, quant

    def __call__(self, completed: float, total: float | None, note: str = "") -> None:
        fraction = completed / total if total else 0.0
        self.overall(self.index + fraction, self.steps, f"{self.quant} {note}".strip())


def prepare_models(
    source: str,
    out_dir: Path,
    toolchain: Toolchain,
    cache: Path,
    environ: Mapping[str, str],
    llama_tree: Callable[[], Path],
    quants: Sequence[str] = ("F16", "Q8_0", "Q4_K_M"),
    tiny_seed: int = 0,
    progress: ProgressCallback = no_progress,
) -> Manifest:
    """Make (or reuse) one GGUF per quantization in `out_dir` and write `manifest.json` there."""
    resolved = resolve_source(source, cache, environ)  # a bad source fails before any folder is made
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = out_dir / LOGS_DIR
    manifest_path = out_dir / MANIFEST_JSON
    seed_text = f" seed {tiny_seed}" if resolved.kind == "synthetic" else ""
    source_label = f"{resolved.origin}{seed_text}"
    old = load_manifest(manifest_path)
    old_files = old.files if old is not None else {}
    manifest = Manifest(source=resolved.as_dict(), llama_cpp=toolchain.version_record(), files={})
    ordered = [BASE_QUANT, *[q for q in quants if q != BASE_QUANT]]
    for index, quant in enumerate(ordered):
        target = out_dir / f"{resolved.name}-{quant}.gguf"
        made_from = source_label if quant == BASE_QUANT else (
            f"{BASE_QUANT} sha256:{manifest.files[BASE_QUANT].sha256[:16]}"
        )

        step = _StepProgress(progress, index, len(ordered), quant)
        step(0, None, "checking")
        if _entry_still_valid(target, old_files.get(quant), made_from):
            manifest.files[quant] = old_files[quant]
            continue
        partial = target.with_name(target.name + ".partial")
        started = time.monotonic()
        try:
            if quant == BASE_QUANT:
                _make_base(resolved, partial, toolchain, llama_tree, tiny_seed, log_dir, step)
            else:
                base = out_dir / manifest.files[BASE_QUANT].file
                quantize(toolchain, base, partial, quant, log_dir / f"quantize-{quant}.log", progress=step)
            made_with = f"{toolchain.label} ({toolchain.binary_version})"
            manifest.files[quant] = _finish(partial, target, quant, made_from, started, made_with)
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
        save_manifest(manifest_path, manifest)
        step(1, 1, "done")
    save_manifest(manifest_path, manifest)
    progress(len(ordered), len(ordered), "done")
    return manifest
