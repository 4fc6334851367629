"""The importance matrix of a run: a file the user gave, or one computed with llama-imatrix from
the reference file and the calibration text, kept in the cache by both files' hashes (and the
chunks, context and llama.cpp that made it), so a later run reuses it instead of computing again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from quantload.config import PrepareSettings
from quantload.llamacpp.imatrix import run_imatrix
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.manifest import sha256_of
from quantload.progress import ProgressCallback, no_progress
from quantload.quality.dataset import describe_dataset

IMATRIX_FOLDER = "imatrix"
IMATRIX_TIMEOUT_S = 4 * 3600.0


class ImatrixRecord(BaseModel):
    """Which importance matrix the run used and what it cost (manifest.json's `imatrix`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    mode: str  # "computed" or "given"
    path: str
    sha256: str
    calibration: str | None = None  # the text's name (WikiText-2 raw, train split, or a file name)
    calibration_sha256: str | None = None
    chunks: int | None = None
    ctx_tokens: int | None = None
    reference_sha256: str | None = None
    seconds: float = 0.0  # computing it (0 when given); a reused file keeps its first cost
    reused: bool = False


def _key(*parts: object) -> str:
    import hashlib

    return hashlib.sha256(json.dumps([str(p) for p in parts]).encode()).hexdigest()[:16]


def given_imatrix(path: Path) -> ImatrixRecord:
    """The record of an imatrix file the user gave."""
    return ImatrixRecord(mode="given", path=str(path), sha256=sha256_of(path))


def computed_imatrix(
    toolchain: Toolchain,
    reference: Path,
    calibration: Path,
    prepare: PrepareSettings,
    cache: Path,
    log_path: Path,
    progress: ProgressCallback = no_progress,
) -> ImatrixRecord:
    """The importance matrix of `reference` on `calibration`: from the cache, or computed now."""
    reference_sha = sha256_of(reference)
    text = describe_dataset(calibration)
    key = _key(reference_sha, text.sha256, prepare.imatrix_chunks, prepare.imatrix_ctx, toolchain.label)
    folder = cache / IMATRIX_FOLDER
    folder.mkdir(parents=True, exist_ok=True)
    target, record_path = folder / f"{key}.gguf", folder / f"{key}.json"
    if target.is_file() and record_path.is_file():
        try:
            kept = ImatrixRecord.model_validate_json(record_path.read_text(encoding="utf-8"))
        except ValueError:
            kept = None
        if kept is not None and kept.sha256 == sha256_of(target):
            return kept.model_copy(update={"reused": True, "path": str(target)})
    run = run_imatrix(
        toolchain, reference, calibration, target, prepare.imatrix_ctx, prepare.imatrix_chunks,
        log_path, progress, IMATRIX_TIMEOUT_S,
    )  # fmt: skip
    record = ImatrixRecord(
        mode="computed", path=str(target), sha256=sha256_of(target), calibration=text.name,
        calibration_sha256=text.sha256, chunks=run.chunks, ctx_tokens=prepare.imatrix_ctx,
        reference_sha256=reference_sha, seconds=round(run.wall_time_s, 2),
    )  # fmt: skip
    record_path.write_text(record.model_dump_json(indent=2) + "\n", encoding="utf-8")
    return record


def imatrix_metadata(metadata: dict[str, Any]) -> dict[str, Any] | None:
    """What a quantized file's own metadata says of the importance matrix it was made with
    (llama-quantize's `quantize.imatrix.*` keys); None when it was made without one."""
    prefix = "quantize.imatrix."
    found = {key[len(prefix) :]: value for key, value in metadata.items() if key.startswith(prefix)}
    return found or None
