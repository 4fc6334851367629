"""A GGUF file's metadata and tensor table, read in well under a second.

`gguf.GGUFReader` decodes every element of every metadata array, which takes tens of seconds for a
150,000-token vocabulary in pure Python. This scanner walks the header of a GGUF v2/v3
(little-endian) file once: scalars and strings are decoded, long arrays (the vocabulary, merges)
are skipped by their length, and each tensor's bytes follow from its type's block size.
`quantload.models.gguf_meta.read_gguf` builds its summary from this scan (the tests check it
against `gguf.GGUFReader`, the library reader, on real files).
"""

from __future__ import annotations

import math
import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantload.errors import ModelError

# struct formats of the fixed-size GGUF value types, by type id.
_SCALARS: dict[int, str] = {
    0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
    10: "<Q", 11: "<q", 12: "<d",
}  # fmt: skip
_STRING = 8
_ARRAY = 9
# Arrays longer than this are summarized as "<N items>", as read_gguf does.
_ARRAY_LIMIT = 64
DEFAULT_ALIGNMENT = 32
GGUF_MAGIC = b"GGUF"
SKIPPED_PREFIX = "tokenizer.ggml."
KEPT_TOKENIZER_KEYS = ("tokenizer.ggml.model", "tokenizer.ggml.pre")


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's size and where its data ends in the file."""

    n_elements: int
    n_bytes: int
    data_end: int
    dims: tuple[int, ...] = ()  # in GGUF order (the row length first)
    type_id: int = -1  # ggml_type (gguf.GGMLQuantizationType)


@dataclass(frozen=True)
class GgufScan:
    """The decoded metadata and the tensor table of one GGUF file."""

    metadata: dict[str, Any]
    tensors: dict[str, TensorInfo]

    def tensor_table(self) -> dict[str, tuple[int, int]]:
        """{name: (bytes, elements)}."""
        return {name: (t.n_bytes, t.n_elements) for name, t in self.tensors.items()}


class _Cursor:
    """Reads little-endian values from a memory-mapped file."""

    def __init__(self, data: mmap.mmap, path: Path) -> None:
        self.data = data
        self.path = path
        self.pos = 0

    def take(self, width: int) -> bytes:
        end = self.pos + width
        if end > len(self.data):
            raise ModelError(f"{self.path} ends inside its header (truncated)", "prepare it again")
        chunk = self.data[self.pos : end]
        self.pos = end
        return chunk

    def uint(self, width: int) -> int:
        return int.from_bytes(self.take(width), "little")

    def string(self) -> str:
        return self.take(self.uint(8)).decode("utf-8", "replace")

    def value(self, value_type: int, keep: bool, whole: bool = False) -> Any:
        """One value; `keep` False skips it, `whole` keeps an array of any length."""
        if value_type in _SCALARS:
            fmt = _SCALARS[value_type]
            return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]
        if value_type == _STRING:
            raw = self.take(self.uint(8))
            return raw.decode("utf-8", "replace") if keep else None
        if value_type != _ARRAY:
            raise ModelError(f"{self.path} has an unknown GGUF value type {value_type}")
        item_type, count = self.uint(4), self.uint(8)
        keep_items = keep and (whole or count <= _ARRAY_LIMIT)
        if item_type in _SCALARS and not keep_items:
            self.take(struct.calcsize(_SCALARS[item_type]) * count)
        else:
            items = [self.value(item_type, keep_items) for _ in range(count)]
            if keep_items:
                return items
        return f"<{count} items>" if keep else None


def _block_sizes() -> dict[int, tuple[int, int]]:
    from gguf.constants import GGML_QUANT_SIZES

    return {int(kind): (int(block), int(size)) for kind, (block, size) in GGML_QUANT_SIZES.items()}


def _scan(cursor: _Cursor, whole_keys: frozenset[str] = frozenset()) -> GgufScan:
    path = cursor.path
    cursor.take(4)  # magic, checked by the caller
    version = cursor.uint(4)
    if version not in (2, 3):
        raise ModelError(f"{path} is GGUF version {version}; quantload reads versions 2 and 3")
    n_tensors, n_kv = cursor.uint(8), cursor.uint(8)
    metadata: dict[str, Any] = {
        "GGUF.version": version, "GGUF.tensor_count": n_tensors, "GGUF.kv_count": n_kv,
    }  # fmt: skip
    for _ in range(n_kv):
        key = cursor.string()
        whole = key in whole_keys
        keep = whole or not key.startswith(SKIPPED_PREFIX) or key in KEPT_TOKENIZER_KEYS
        value = cursor.value(cursor.uint(4), keep, whole)
        if keep:
            metadata[key] = value
    sizes = _block_sizes()
    layout: list[tuple[str, int, int, int, tuple[int, ...], int]] = []
    for _ in range(n_tensors):
        name = cursor.string()
        dims = tuple(cursor.uint(8) for _ in range(cursor.uint(4)))
        elements = math.prod(dims)
        kind, offset = cursor.uint(4), cursor.uint(8)
        if kind not in sizes:
            raise ModelError(f"{path}: tensor {name} has an unknown type {kind}")
        block, block_bytes = sizes[kind]
        layout.append((name, elements, elements // block * block_bytes, offset, dims, kind))
    alignment = int(metadata.get("general.alignment", DEFAULT_ALIGNMENT))
    data_start = -(-cursor.pos // alignment) * alignment
    tensors = {
        name: TensorInfo(elements, n_bytes, data_start + offset + n_bytes, dims, kind)
        for name, elements, n_bytes, offset, dims, kind in layout
    }
    return GgufScan(metadata=metadata, tensors=tensors)


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


def scan_gguf(path: Path, whole_keys: frozenset[str] = frozenset()) -> GgufScan:
    """Metadata and tensor table of a GGUF file; ModelError if it is not one or is cut short.

    The keys of `whole_keys` (e.g. `tokenizer.ggml.tokens`) are kept whole, however long."""
    check_is_gguf(path)
    try:
        with (
            path.open("rb") as handle,
            mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data,
        ):
            return _scan(_Cursor(data, path), whole_keys)
    except (OSError, ValueError, struct.error) as error:
        raise ModelError(f"cannot read the GGUF header of {path} ({error})") from None

