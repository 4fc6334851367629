"""Reading what a GGUF file says about itself, and telling a good file from a broken one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantload.errors import ModelError

GGUF_MAGIC = b"GGUF"
# general.file_type values (llama_ftype) for the types we prepare or accept as a source.
FILE_TYPE_NAMES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
    16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 32: "BF16",
}


@dataclass(frozen=True)
class GgufSummary:
    """The metadata and tensor totals of one GGUF file."""

    path: Path
    size_bytes: int
    architecture: str
    name: str
    file_type: str
    n_params: int
    tensor_bytes: int
    n_tensors: int
    metadata: dict[str, Any]

    def arch_value(self, key: str, default: Any = None) -> Any:
        """A `<architecture>.<key>` metadata value."""
        return self.metadata.get(f"{self.architecture}.{key}", default)


def check_is_gguf(path: Path) -> None:
    """Raise ModelError if `path` is missing or does not start with the GGUF magic."""
    if not path.exists():
        raise ModelError(f"model file {path} does not exist", "check the path")
    if not path.is_file():
        raise ModelError(f"{path} is not a file", "give the path of a .gguf file")
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != GGUF_MAGIC:
        raise ModelError(
            f"{path} is not a GGUF file (starts with {magic!r}, expected b'GGUF')",
            "convert it with llama.cpp's convert_hf_to_gguf.py, or pass a .gguf file",
        )


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, list) and len(value) > 64:
        return f"<{len(value)} items>"
    return value


def read_gguf(path: Path) -> GgufSummary:
    """Summarize a GGUF file; a truncated or corrupt file raises ModelError."""
    import gguf  # heavy import, only when a file is read

    check_is_gguf(path)
    size = path.stat().st_size
    try:
        reader = gguf.GGUFReader(path)
        metadata = {
            key: _plain(field.contents())
            for key, field in reader.fields.items()
            if not key.startswith("tokenizer.ggml.") or key in ("tokenizer.ggml.model", "tokenizer.ggml.pre")
        }
        tensors = reader.tensors
    except (ValueError, IndexError, KeyError, OSError) as error:
        raise ModelError(
            f"{path} is a corrupt or truncated GGUF file ({error})", "delete it and prepare it again"
        ) from None
    end = max((int(t.data_offset) + int(t.n_bytes) for t in tensors), default=0)
    if end > size:
        raise ModelError(
            f"{path} is truncated: tensors end at byte {end}, the file has {size}",
            "delete it and prepare it again",
        )
    architecture = str(metadata.get("general.architecture", ""))
    if not architecture:
        raise ModelError(f"{path} has no general.architecture key", "is it a model file?")
    file_type_id = metadata.get("general.file_type")
    file_type = "unknown"
    if file_type_id is not None:
        file_type = FILE_TYPE_NAMES.get(int(file_type_id), str(file_type_id))
    return GgufSummary(
        path=path,
        size_bytes=size,
        architecture=architecture,
        name=str(metadata.get("general.name", path.stem)),
        file_type=file_type,
        n_params=sum(int(t.n_elements) for t in tensors),
        tensor_bytes=sum(int(t.n_bytes) for t in tensors),
        n_tensors=len(tensors),
        metadata=metadata,
    )
