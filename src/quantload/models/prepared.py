"""The prepare step: the files of a run, made once and reused from the cache (the model's
reference and every type and mix asked for, quantload.models.prepare), or the user's own files
(prepare.files, quantload.models.given_files); what `quantload prepare` and `quantload run`
(through RunSteps) call."""

from __future__ import annotations

import functools
import shutil
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from quantload.cache_lock import cache_lock
from quantload.config import ModelSettings, PrepareSettings, QualitySettings, ToolchainSettings
from quantload.llamacpp.quant_types import quant_types
from quantload.llamacpp.toolchain import Toolchain, ensure_llama_source
from quantload.models.calibration import calibration_path, check_calibration_file
from quantload.models.file_plan import imatrix_mode, plan_files
from quantload.models.given_files import HF_PREFIX, adopt_files, check_given_files
from quantload.models.manifest import Manifest, save_manifest
from quantload.models.prepare import prepare_models
from quantload.progress import ProgressCallback, no_progress
from quantload.quality.dataset import cached_text_path
from quantload.rundir.handle import RunDir

PREPARED_DIR = "prepared"  # under the cache: one folder per model source, shared by every run


@dataclass(frozen=True)
class PreparedModels:
    """The prepared files: a manifest whose every entry's path is absolute."""

    folder: Path
    manifest: Manifest
    busy_s: float

    def quants(self) -> list[str]:
        """Every file's label, largest first: the run's one order (the manifest's)."""
        return self.manifest.ordered_labels()

    def path(self, quant: str) -> Path:
        """The file of one quantization."""
        return Path(self.manifest.files[quant].path)

    @property
    def reference(self) -> str | None:
        """The label of the file KLD is measured against; None when there is none."""
        return self.manifest.reference_label()

    @property
    def model_name(self) -> str:
        """The model's name, as the manifest's source gives it."""
        return str(self.manifest.source.get("name", "model"))


def prepared_folder(cache: Path, source: str) -> Path:
    """Where the files of `source` are kept in the cache."""
    path = Path(source)
    name = f"local-{path.stem}" if path.suffix == ".gguf" else source.replace("/", "-")
    return cache / PREPARED_DIR / name


def scored_text_on_disk(quality: QualitySettings, cache: Path) -> Path | None:
    """The text quality will be scored on, where it is already on disk (nothing is downloaded)."""
    if quality.dataset is not None:
        return quality.dataset.expanduser()
    cached = cached_text_path(cache)
    return cached if cached.is_file() else None


def preflight(
    prepare: PrepareSettings, quality: QualitySettings, cache: Path, toolchain: Toolchain | None = None
) -> None:
    """What prepare's settings say that can be checked before any file: the importance-matrix
    setting and calibration text, the user's local files (GGUF, whole, one model, a reference), and
    with a `toolchain` already built, every type and mix against its llama-quantize (without one,
    prepare checks them first thing, before it makes anything). One-line ConfigError or ModelError."""
    if toolchain is not None and not prepare.files:
        plan_files(prepare, quant_types(toolchain))
    mode = imatrix_mode(prepare)
    scored = scored_text_on_disk(quality, cache)
    if mode == "computed" and (on_disk := calibration_path(prepare, cache)) is not None:
        check_calibration_file(on_disk, prepare.imatrix_ctx, scored)
    if prepare.files and not any(spec.startswith(HF_PREFIX) for spec in prepare.files):
        check_given_files(prepare, cache)


def prepare_model_files(
    model: ModelSettings,
    toolchain_settings: ToolchainSettings,
    toolchain: Toolchain,
    cache: Path,
    environ: Mapping[str, str],
    folder: Path,
    progress: ProgressCallback = no_progress,
    run_dir: Path | None = None,
    prepare: PrepareSettings | None = None,
    scored_text: Path | None = None,
) -> PreparedModels:
    """Make (or reuse) the files of `model.source` in `folder`, or take `prepare.files` as they are
    (their manifest is written in `folder`).

    With `run_dir`, the manifest and the tools' logs are filed into that run directory as well.
    """
    prepare = prepare or PrepareSettings()
    started = time.monotonic()
    waiting = functools.partial(progress, 0, None)  # said once while another process writes the folder
    with cache_lock(folder, "the prepared files", on_wait=waiting):  # two runs never see half of it
        if prepare.files:
            manifest = adopt_files(prepare, cache, environ, toolchain.version_record(), progress)
            folder.mkdir(parents=True, exist_ok=True)
            save_manifest(RunDir(folder).manifest_path, manifest)
        else:
            manifest = prepare_models(
                model.source, folder, toolchain, cache, environ,
                functools.partial(ensure_llama_source, toolchain_settings, environ),
                prepare=prepare, tiny_seed=model.tiny_seed, progress=progress, scored_text=scored_text,
            )  # fmt: skip
    prepared = PreparedModels(folder, _absolute(manifest, folder), time.monotonic() - started)
    if run_dir is not None:
        save_manifest(RunDir(run_dir).manifest_path, prepared.manifest)
        if folder.resolve() != run_dir.resolve():  # the prepared folder keeps a run directory's logs/
            _copy_logs(RunDir(folder).logs_path, RunDir(run_dir).logs_path, prefix="prepare-")
    return prepared


def _absolute(manifest: Manifest, folder: Path) -> Manifest:
    """The manifest with every entry's path pointing at its file: a made file beside the manifest,
    a given file where it is."""
    files = {
        quant: entry.model_copy(update={"path": str((folder / entry.file).resolve())})
        if entry.made_from != "given"
        else entry
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
