"""The manifest of prepared files (`manifest.json`, schema `quantload.manifest/1`).

{
  "schema": "quantload.manifest/1",
  "source": {kind, name, origin, base_path, base_file_type, note},
  "llama_cpp": {origin, sdist, binary_version, bin_dir},
  "reference": "<LABEL>" | null,  # the file every KLD is measured against (F16, BF16 or F32)
  "imatrix": ImatrixRecord | null,  # the importance matrix used (quantload.models.imatrix_file)
  "files": {                        # largest file first: the order of every table and figure
     "<LABEL>": {quant (the label: a type, TYPE-imatrix or a mix's name), file (name relative to
                 the manifest's folder), path (absolute when made), size_bytes, sha256, n_params,
                 tensor_bytes, architecture, file_type (the GGUF's own general.file_type),
                 made_from, seconds, made_with, recipe (type and llama-quantize flags),
                 imatrix (the file's own quantize.imatrix.* metadata, null when made without),
                 origin (where the file came from), moe (a mixture of experts' expert_count,
                 expert_used_count, total_params, active_params, expert_params, expert_bytes,
                 other_bytes: quantload.models.moe; null for a dense model)}
  }
}
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from quantload.cache_lock import cache_lock
from quantload.rundir import read_json, write_json_atomic
from quantload.rundir.handle import RunDir

SCHEMA = "quantload.manifest/1"


class ManifestEntry(BaseModel):
    """One prepared file."""

    model_config = ConfigDict(extra="forbid")

    quant: str
    file: str
    path: str
    size_bytes: int
    sha256: str
    n_params: int
    tensor_bytes: int
    architecture: str
    file_type: str
    made_from: str
    seconds: float
    # the llama.cpp that wrote this file (a reused file keeps the one that made it); None in
    # manifests written before it was recorded
    made_with: str | None = None
    recipe: str | None = None  # e.g. "Q4_K_M --tensor-type attn_v=q8_0", for made files
    imatrix: dict[str, Any] | None = None  # the file's quantize.imatrix.* keys; None: made without
    origin: str | None = None  # "made from F16", or the given file's path or Hugging Face repo
    moe: dict[str, Any] | None = None  # quantload.models.moe.MoeFacts; None: a dense model

    def recipe_changes_tensors(self) -> bool:
        """Whether the recipe overrides some tensors' types (a mix, not a plain type)."""
        return bool(self.recipe and " --" in f" {self.recipe}")


class Manifest(BaseModel):
    """Every prepared file of one model."""

    model_config = ConfigDict(extra="forbid")

    schema_version: str = SCHEMA
    source: dict[str, Any]
    llama_cpp: dict[str, Any]
    files: dict[str, ManifestEntry]
    reference: str | None = None
    imatrix: dict[str, Any] | None = None

    def ordered_labels(self) -> list[str]:
        """Every file's label, largest file first: the one order every table, figure and plan
        uses (ties keep the manifest's order)."""
        return sorted(self.files, key=lambda label: -self.files[label].size_bytes)

    def sorted_by_size(self) -> Manifest:
        """A copy whose files are in `ordered_labels` order."""
        ordered = {label: self.files[label] for label in self.ordered_labels()}
        return self.model_copy(update={"files": ordered})

    def reference_label(self) -> str | None:
        """The file every KLD is measured against: the recorded one, else the F16/BF16/F32 among
        the files (best precision first); None when there is none."""
        if self.reference is not None and self.reference in self.files:
            return self.reference
        for kind in ("F32", "BF16", "F16"):
            for label, entry in self.files.items():
                if entry.file_type == kind and not entry.recipe_changes_tensors():
                    return label
        return None

    def path_of(self, quant: str, folder: Path) -> Path:
        """Absolute path of a prepared file, looked up relative to the manifest's folder."""
        return folder / self.files[quant].file

    def to_json(self) -> dict[str, Any]:
        data = self.model_dump(mode="json")
        data = {"schema": data.pop("schema_version"), **data}
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Manifest:
        data = dict(data)
        data["schema_version"] = data.pop("schema", SCHEMA)
        return cls.model_validate(data)


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file, read in 1 MiB blocks."""
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def load_manifest(path: Path, locked: bool = True) -> Manifest | None:
    """The manifest at `path`, or None when absent or unreadable; read whole, under its folder's
    shared lock (a prepare writing that folder is waited for: quantload.cache_lock), unless the
    caller holds the folder's lock itself (`locked=False`)."""
    if not path.is_file():
        return None
    if not locked:
        return _read_manifest(path)
    with cache_lock(path.parent, "the prepared files", shared=True):
        return _read_manifest(path)


def _read_manifest(path: Path) -> Manifest | None:
    try:
        return Manifest.from_json(read_json(path))
    except (OSError, ValueError):
        return None


def source_note_of(model: Path) -> str | None:
    """The source note (e.g. "F16 reconstructed from the Q4_1 release ...") of a prepared file,
    from the manifest beside it; None for a file no manifest there lists."""
    manifest = load_manifest(RunDir(model.parent).manifest_path)
    if manifest is None or not any(entry.file == model.name for entry in manifest.files.values()):
        return None
    note = manifest.source.get("note")
    return str(note) if note else None


def save_manifest(path: Path, manifest: Manifest) -> None:
    """Write the manifest atomically, largest file first."""
    write_json_atomic(path, manifest.sorted_by_size().to_json())
