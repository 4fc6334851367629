"""The prepare step: one GGUF per quantization of a model, made once and reused from the cache."""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from quantload.config import ModelSettings, ToolchainSettings
from quantload.llamacpp.toolchain import Toolchain, ensure_llama_source
from quantload.models.manifest import Manifest, save_manifest
from quantload.models.prepare import prepare_models
from quantload.progress import ProgressCallback, no_progress
from quantload.rundir import LOGS_DIR, MANIFEST_JSON

PREPARED_DIR = "prepared"  # under the cache: one folder per model source, shared by every run


@dataclass(frozen=True)
class PreparedModels:
    """The prepared files: a manifest whose every entry's path is absolute."""

    folder: Path
    manifest: Manifest
    busy_s: float

    def quants(self, asked: Sequence[str]) -> list[str]:
        """The quantizations asked for, in the order asked, that were prepared."""
        return [quant for quant in asked if quant in self.manifest.files]

    def path(self, quant: str) -> Path:
        """The file of one quantization."""
        return Path(self.manifest.files[quant].path)

    @property
    def model_name(self) -> str:
        """The model's name, as the manifest's source gives it."""
        return str(self.manifest.source.get("name", "model"))


def prepared_folder(cache: Path, source: str) -> Path:
    """Where the files of `source` are kept in the cache."""
    path = Path(source)
    name = f"local-{path.stem}" if path.suffix == ".gguf" else source.replace("/", "-")
    return cache / PREPARED_DIR / name


def prepare_model_files(
    model: ModelSettings,
    toolchain_settings: ToolchainSettings,
    toolchain: Toolchain,
    cache: Path,
    environ: Mapping[str, str],
    folder: Path,
    progress: ProgressCallback = no_progress,
    run_dir: Path | None = None,
) -> PreparedModels:
    """Make (or reuse) the files of `model.source` in `folder`.

    With `run_dir`, the manifest and the tools' logs are filed into that run directory as well.
    """
    started = time.monotonic()
    manifest = prepare_models(
        model.source,
        folder,
        toolchain,
        cache,
        environ,
        functools.partial(ensure_llama_source, toolchain_settings, environ),
        quants=model.quants,
        tiny_seed=model.tiny_seed,
        progress=progress,
    )
    prepared = PreparedModels(folder, _absolute(manifest, folder), time.monotonic() - started)
    if run_dir is not None:
        save_manifest(run_dir / MANIFEST_JSON, prepared.manifest)
        _copy_logs(folder / LOGS_DIR, run_dir / LOGS_DIR, prefix="prepare-")
    return prepared


def _absolute(manifest: Manifest, folder: Path) -> Manifest:
    """The manifest with every entry's path pointing at the prepared file."""
    files = {
        quant: entry.model_copy(update={"path": str((folder / entry.file).resolve())})
        for quant, entry in manifest.files.items()
    }
    return manifest.model_copy(update={"files": files})


def _copy_logs(source_dir: Path, target_dir: Path, prefix: str) -> None:
    """Copy the tool logs of the shared prepared folder into the run (files made earlier included)."""
    if not source_dir.is_dir():
        return
    target_dir.mkdir(parents=True, exist_ok=True)
    for log in sorted(source_dir.glob("*.log")):
        shutil.copyfile(log, target_dir / f"{prefix}{log.name}")
