"""Preparing the files of one model, idempotently: the reference (the best precision the source
has), then every type and mix of the plan, with the importance matrix where asked.

Everything that can be checked is checked before any file is made (`plan_files`: each type
against the built llama-quantize's own list, each mix, each file's need of an importance matrix;
the imatrix file or calibration text). Each file is written under a `.partial` name, checked
(GGUF header, tensors within the file), then renamed, so a final name never holds half a file;
the manifest is saved after each one, so a failure later loses nothing made before it. A file
already listed in the manifest with the same size, sha256 and recipe is reused; anything else
under a final name is rebuilt.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from quantload.config import PrepareSettings
from quantload.errors import ModelError
from quantload.llamacpp.quant_types import REFERENCE_TYPES, quant_types
from quantload.llamacpp.quantize import QuantizeOptions, quantize
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.calibration import calibration_path, check_calibration_file, resolve_calibration
from quantload.models.file_plan import FilePlan, PlannedFile, check_overrides_match, plan_files
from quantload.models.gguf_meta import read_gguf
from quantload.models.gguf_scan import scan_gguf
from quantload.models.imatrix_file import ImatrixRecord, computed_imatrix, given_imatrix, imatrix_metadata
from quantload.models.manifest import Manifest, ManifestEntry, load_manifest, save_manifest, sha256_of
from quantload.models.moe import file_moe_facts
from quantload.models.sources import TINY_MOE_NAME, ResolvedSource, resolve_source
from quantload.models.synthetic import write_tiny_model
from quantload.models.synthetic_moe import write_tiny_moe
from quantload.progress import ProgressCallback, no_progress
from quantload.rundir.handle import RunDir

BASE_QUANT = "F16"  # the reference of a source that is quantized (or synthetic)


def write_synthetic(resolved: ResolvedSource, llama_tree: Path, out_path: Path, seed: int) -> None:
    """Write the synthetic model `resolved` names (the tiny MoE, else the tiny dense one)."""
    if resolved.name == TINY_MOE_NAME:
        write_tiny_moe(llama_tree, out_path, seed=seed)
    else:
        write_tiny_model(llama_tree, out_path, seed=seed)


def reference_type_of(resolved: ResolvedSource) -> str:
    """The best precision the source has: its own F32/BF16/F16, else F16 (rebuilt from it)."""
    return resolved.base_file_type if resolved.base_file_type in REFERENCE_TYPES else BASE_QUANT


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def _entry_still_valid(path: Path, entry: ManifestEntry | None, made_from: str, recipe: str) -> bool:
    if entry is None or entry.made_from != made_from or not path.is_file():
        return False
    if (entry.recipe or entry.quant) != recipe:  # manifests from before recipes: the plain type
        return False
    return path.stat().st_size == entry.size_bytes and sha256_of(path) == entry.sha256


def _finish(
    partial: Path, target: Path, label: str, made_from: str, started: float, made_with: str,
    recipe: str, origin: str,
) -> ManifestEntry:  # fmt: skip
    summary = read_gguf(partial)  # raises on a truncated or corrupt result
    experts = file_moe_facts(summary)
    partial.replace(target)
    return ManifestEntry(
        quant=label,
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
        recipe=recipe,
        imatrix=imatrix_metadata(summary.metadata),
        origin=origin,
        moe=experts.as_dict() if experts else None,
    )


def _make_reference(
    resolved: ResolvedSource,
    reference_type: str,
    partial: Path,
    toolchain: Toolchain,
    llama_tree: Callable[[], Path],
    tiny_seed: int,
    log_dir: Path,
    progress: ProgressCallback,
) -> None:
    if resolved.kind == "synthetic":
        write_synthetic(resolved, llama_tree(), partial, tiny_seed)
    elif resolved.base_path is None:
        raise ModelError(f"source {resolved.name} has no file")
    elif resolved.base_file_type == reference_type:
        _link_or_copy(resolved.base_path, partial)
    else:
        quantize(
            toolchain, resolved.base_path, partial, reference_type,
            log_dir / f"quantize-{reference_type}.log",
            allow_requantize=resolved.base_file_type not in REFERENCE_TYPES, progress=progress,
        )  # fmt: skip


class _StepProgress:
    """Progress of one file, reported as a fraction of all files."""

    def __init__(self, overall: ProgressCallback, index: int, steps: int, quant: str) -> None:
        self.overall, self.index, self.steps, self.quant = overall, index, steps, quant

    def __call__(self, completed: float, total: float | None, note: str = "") -> None:
        fraction = completed / total if total else 0.0
        self.overall(self.index + fraction, self.steps, f"{self.quant} {note}".strip())


def check_imatrix_inputs(
    prepare: PrepareSettings, plan: FilePlan, cache: Path, scored_text: Path | None
) -> None:
    """Before any work: a calibration text on disk is checked now (one that must be downloaded
    is checked once it is there)."""
    if not plan.needs_imatrix or plan.imatrix != "computed":
        return
    on_disk = calibration_path(prepare, cache)
    if on_disk is not None:
        check_calibration_file(on_disk, prepare.imatrix_ctx, scored_text)


def _imatrix(
    prepare: PrepareSettings, plan: FilePlan, toolchain: Toolchain, reference: Path, cache: Path,
    environ: Mapping[str, str], log_dir: Path, scored_text: Path | None, progress: ProgressCallback,
) -> ImatrixRecord | None:  # fmt: skip
    if not plan.needs_imatrix:
        return None
    if plan.imatrix != "computed":
        return given_imatrix(Path(plan.imatrix))
    calibration = resolve_calibration(prepare, cache, environ, scored_text)
    log = log_dir / "llama-imatrix.log"
    return computed_imatrix(toolchain, reference, calibration, prepare, cache, log, progress)


def _options(item: PlannedFile, imatrix: ImatrixRecord | None) -> QuantizeOptions:
    if not item.imatrix:
        return item.options
    assert imatrix is not None
    return QuantizeOptions(**{**item.options.__dict__, "imatrix": Path(imatrix.path)})


def _quantize_one(
    toolchain: Toolchain, reference: Path, item: PlannedFile, options: QuantizeOptions, log_dir: Path,
    partial: Path, progress: ProgressCallback,
) -> None:  # fmt: skip
    log = log_dir / f"quantize-{item.label}.log"
    quantize(toolchain, reference, partial, item.quant_type, log, progress=progress, options=options)


def prepare_models(
    source: str,
    out_dir: Path,
    toolchain: Toolchain,
    cache: Path,
    environ: Mapping[str, str],
    llama_tree: Callable[[], Path],
    prepare: PrepareSettings | None = None,
    tiny_seed: int = 0,
    progress: ProgressCallback = no_progress,
    scored_text: Path | None = None,
) -> Manifest:
    """Make (or reuse) the reference and one GGUF per planned file in `out_dir`, and write
    `manifest.json` there (largest file first). `scored_text` is the text quality is scored on,
    which the importance matrix's calibration text must not be."""
    prepare = prepare or PrepareSettings()
    full_plan = plan_files(prepare, quant_types(toolchain))  # bad types fail before anything is made
    check_imatrix_inputs(prepare, full_plan, cache, scored_text)
    resolved = resolve_source(source, cache, environ)  # a bad source fails before any folder is made
    reference_type = reference_type_of(resolved)
    plan = full_plan.without(reference_type)
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir = RunDir(out_dir).logs_path  # a prepared folder keeps a run directory's logs/ and manifest
    manifest_path = RunDir(out_dir).manifest_path
    seed_text = f" seed {tiny_seed}" if resolved.kind == "synthetic" else ""
    source_label = f"{resolved.origin}{seed_text}"
    old = load_manifest(manifest_path, locked=False)  # the caller holds the folder's lock
    old_files = old.files if old is not None else {}
    manifest = Manifest(
        source=resolved.as_dict(), llama_cpp=toolchain.version_record(), files={}, reference=reference_type
    )
    steps = 1 + len(plan.files) + (1 if plan.needs_imatrix else 0)
    made_with = f"{toolchain.label} ({toolchain.binary_version})"

    def make(
        index: int, label: str, made_from: str, recipe: str,
        build: Callable[[Path, ProgressCallback], None], origin: str,
    ) -> None:  # fmt: skip
        target = out_dir / f"{resolved.name}-{label}.gguf"
        step = _StepProgress(progress, index, steps, label)
        step(0, None, "checking")
        if _entry_still_valid(target, old_files.get(label), made_from, recipe):
            manifest.files[label] = old_files[label]
            return
        partial = target.with_name(target.name + ".partial")
        started = time.monotonic()
        try:
            build(partial, step)
            manifest.files[label] = _finish(
                partial, target, label, made_from, started, made_with, recipe, origin
            )
        finally:
            with contextlib.suppress(FileNotFoundError):
                partial.unlink()
        save_manifest(manifest_path, manifest)
        step(1, 1, "done")

    make(
        0, reference_type, source_label, reference_type,
        lambda partial, step: _make_reference(
            resolved, reference_type, partial, toolchain, llama_tree, tiny_seed, log_dir, step
        ),
        origin=source_label,
    )  # fmt: skip
    reference = out_dir / manifest.files[reference_type].file
    check_overrides_match(plan, list(scan_gguf(reference).tensors))  # before any file made from it
    reference_from = f"{reference_type} sha256:{manifest.files[reference_type].sha256[:16]}"
    imatrix = _imatrix(
        prepare, plan, toolchain, reference, cache, environ, log_dir, scored_text,
        _StepProgress(progress, 1, steps, "importance matrix"),
    )  # fmt: skip
    if imatrix is not None:
        manifest.imatrix = imatrix.model_dump(mode="json")
    first = 2 if plan.needs_imatrix else 1
    for index, item in enumerate(plan.files, start=first):
        with_matrix = f"; imatrix sha256:{imatrix.sha256[:16]}" if item.imatrix and imatrix else ""
        made_from = reference_from + with_matrix
        options = _options(item, imatrix)
        build = functools.partial(_quantize_one, toolchain, reference, item, options, log_dir)
        origin = f"made from {reference_type} by llama-quantize"
        make(index, item.label, made_from, item.recipe, build, origin)
    save_manifest(manifest_path, manifest)
    progress(steps, steps, "done")
    return manifest.sorted_by_size()
