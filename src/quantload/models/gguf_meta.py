"""What a GGUF file says about itself, and telling a good file from a broken one.

The header is read by quantload.models.gguf_scan (fast: it skips the vocabulary arrays that make
gguf.GGUFReader take tens of seconds on a 150,000-token model).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantload.errors import ModelError
from quantload.models.gguf_scan import GgufScan, check_is_gguf, scan_gguf

__all__ = ["FILE_TYPE_NAMES", "GgufSummary", "check_is_gguf", "read_gguf", "summarize_scan"]

# general.file_type values: llama.cpp's llama_ftype (include/llama.h, pinned b11434).
FILE_TYPE_NAMES: dict[int, str] = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1",
    10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M",
    16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S",
    22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
    39: "NVFP4", 40: "Q1_0", 41: "Q2_0",
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


def read_gguf(path: Path) -> GgufSummary:
    """Summarize a GGUF file; a missing, foreign, truncated or corrupt file raises ModelError."""
    scan = scan_gguf(path)
    size = path.stat().st_size
    end = max((t.data_end for t in scan.tensors.values()), default=0)
    if end > size:
        raise ModelError(
            f"{path} is truncated: tensors end at byte {end}, the file has {size}",
            "delete it and prepare it again",
        )
    return summarize_scan(path, size, scan)


def summarize_scan(path: Path, size_bytes: int, scan: GgufScan) -> GgufSummary:
    """The summary of a scanned header; `size_bytes` is the whole file's (the header may be all
    that was read, e.g. from a container). ModelError when the header names no architecture."""
    metadata = scan.metadata
    architecture = str(metadata.get("general.architecture", ""))
    if not architecture:
        raise ModelError(f"{path} has no general.architecture key", "is it a model file?")
    file_type_id = metadata.get("general.file_type")
    file_type = "unknown"
    if file_type_id is not None:
        file_type = FILE_TYPE_NAMES.get(int(file_type_id), str(file_type_id))
    return GgufSummary(
        path=path,
        size_bytes=size_bytes,
        architecture=architecture,
        name=str(metadata.get("general.name", path.stem)),
        file_type=file_type,
        n_params=sum(t.n_elements for t in scan.tensors.values()),
        tensor_bytes=sum(t.n_bytes for t in scan.tensors.values()),
        n_tensors=len(scan.tensors),
        metadata=metadata,
    )
