"""The manifest of prepared files (`manifest.json`, schema `quantload.manifest/1`).

{
  "schema": "quantload.manifest/1",
  "source": {kind, name, origin, base_path, base_file_type, note},
  "llama_cpp": {origin, sdist, binary_version, bin_dir},
  "files": {
     "<QUANT>": {quant, file (name relative to the manifest's folder), path (absolute when made),
                 size_bytes, sha256, n_params, tensor_bytes, architecture, file_type,
                 made_from, seconds}
  }
}
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from quantload.rundir import MANIFEST_JSON, read_json, write_json_atomic

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


class Manifest(BaseModel):
    """Every prepared file of one model."""

    model_config = ConfigDict(extra="forbid")

    schema_version: str = SCHEMA
    source: dict[str, Any]
    llama_cpp: dict[str, Any]
    files: dict[str, ManifestEntry]

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


def load_manifest(path: Path) -> Manifest | None:
    """The manifest at `path`, or None when absent or unreadable."""
    if not path.is_file():
        return None
    try:
        return Manifest.from_json(read_json(path))
    except ValueError:
        return None


def source_note_of(model: Path) -> str | None:
    """The source note (e.g. "F16 reconstructed from the Q4_1 release ...") of a prepared file,
    from the manifest beside it; None for a file no manifest there lists."""
    manifest = load_manifest(model.parent / MANIFEST_JSON)
    if manifest is None or not any(entry.file == model.name for entry in manifest.files.values()):
        return None
    note = manifest.source.get("note")
    return str(note) if note else None


def save_manifest(path: Path, manifest: Manifest) -> None:
    """Write the manifest atomically."""
    write_json_atomic(path, manifest.to_json())
