"""KV-cache size predicted from a model's hyperparameters, the way llama.cpp allocates it.

llama.cpp pads the total context to a multiple of 256 cells. A unified cache is one stream of
`n_ctx` cells shared by every slot; otherwise each of the `np` slots gets its own stream of
`pad256(n_ctx // np)` cells. Per layer, K holds `n_stream * cells * head_dim_k * n_head_kv`
elements of the K cache type, V likewise; the bytes of a quantized type are counted per block.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from quantload.errors import ModelError
from quantload.models.gguf_meta import GgufSummary

MIB = 1024 * 1024
CELL_PADDING = 256
# (elements per block, bytes per block) of each cache type llama-server accepts.
CACHE_TYPE_BLOCKS: dict[str, tuple[int, int]] = {
    "f32": (1, 4),
    "f16": (1, 2),
    "bf16": (1, 2),
    "q8_0": (32, 34),
    "q4_0": (32, 18),
    "q4_1": (32, 20),
    "iq4_nl": (32, 18),
    "q5_0": (32, 22),
    "q5_1": (32, 24),
}


def type_size_text(cache_type: str) -> str:
    """Bytes per element of a cache type in words, e.g. '2 B/element' or '34 B per 32 elements'."""
    block, block_bytes = CACHE_TYPE_BLOCKS[cache_type]
    return f"{block_bytes} B/element" if block == 1 else f"{block_bytes} B per {block} elements"


def pad_cells(n: int) -> int:
    """Round up to llama.cpp's multiple of 256 cells."""
    return -(-n // CELL_PADDING) * CELL_PADDING


@dataclass(frozen=True)
class KvShape:
    """The hyperparameters that decide KV-cache size."""

    n_layer: int
    n_head_kv: tuple[int, ...]  # one per layer
    head_dim_k: int
    head_dim_v: int
    n_ctx_train: int
    source: str

    @property
    def bytes_per_token_f16(self) -> int:
        """K plus V bytes one token occupies across all layers at f16."""
        return sum(h * (self.head_dim_k + self.head_dim_v) * 2 for h in self.n_head_kv)


def _per_layer(value: Any, n_layer: int, key: str) -> tuple[int, ...]:
    if isinstance(value, Sequence) and not isinstance(value, str):
        if len(value) != n_layer:
            raise ModelError(f"{key} lists {len(value)} layers, the model has {n_layer}")
        return tuple(int(v) for v in value)
    return (int(value),) * n_layer


def kv_shape_from_gguf(summary: GgufSummary) -> KvShape:
    """Read layers, KV heads and head dimensions from GGUF metadata."""
    arch = summary.architecture
    n_layer = summary.arch_value("block_count")
    n_head = summary.arch_value("attention.head_count")
    n_embd = summary.arch_value("embedding_length")
    if n_layer is None or n_head is None or n_embd is None:
        raise ModelError(
            f"{summary.path} lacks {arch}.block_count, attention.head_count or embedding_length",
            "KV size cannot be predicted for this architecture",
        )
    if summary.arch_value("attention.sliding_window") is not None:
        raise ModelError(
            f"{summary.path} uses sliding-window attention, which this predictor does not model",
            "compare against the server's reported size only",
        )
    n_layer = int(n_layer)
    heads = _per_layer(n_head, n_layer, "attention.head_count")
    heads_kv = _per_layer(summary.arch_value("attention.head_count_kv", n_head), n_layer, "head_count_kv")
    default_dim = int(n_embd) // heads[0]
    return KvShape(
        n_layer=n_layer,
        n_head_kv=heads_kv,
        head_dim_k=int(summary.arch_value("attention.key_length", default_dim)),
        head_dim_v=int(summary.arch_value("attention.value_length", default_dim)),
        n_ctx_train=int(summary.arch_value("context_length", 0)),
        source=f"GGUF metadata of {summary.path.name}",
    )


def kv_shape_from_hf_config(config: Mapping[str, Any], name: str = "config.json") -> KvShape:
    """Read the same from a Hugging Face `config.json`."""
    try:
        n_layer = int(config["num_hidden_layers"])
        n_head = int(config["num_attention_heads"])
        hidden = int(config["hidden_size"])
    except (KeyError, TypeError, ValueError) as error:
        raise ModelError(f"{name} lacks {error}", "give the model's own config.json") from None
    head_dim = int(config.get("head_dim") or hidden // n_head)
    return KvShape(
        n_layer=n_layer,
        n_head_kv=(int(config.get("num_key_value_heads", n_head)),) * n_layer,
        head_dim_k=head_dim,
        head_dim_v=head_dim,
        n_ctx_train=int(config.get("max_position_embeddings", 0)),
        source=name,
    )


@dataclass(frozen=True)
class KvPrediction:
    """A predicted KV-cache size with every factor that went into it."""

    shape: KvShape
    slots: int
    ctx_per_slot: int
    unified: bool
    cache_type_k: str
    cache_type_v: str
    n_ctx: int
    n_stream: int
    cells_per_stream: int
    k_bytes: int
    v_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.k_bytes + self.v_bytes

    @property
    def total_mib(self) -> float:
        return self.total_bytes / MIB

    def formula(self) -> str:
        """The arithmetic written out, as llama.cpp does it."""
        heads = sorted(set(self.shape.n_head_kv))
        head_text = str(heads[0]) if len(heads) == 1 else f"per-layer {list(self.shape.n_head_kv)}"
        return (
            f"layers {self.shape.n_layer} x streams {self.n_stream} x cells {self.cells_per_stream}"
            f" x KV heads {head_text} x (head dim K {self.shape.head_dim_k} x {self.cache_type_k}"
            f" [{type_size_text(self.cache_type_k)}] + head dim V {self.shape.head_dim_v}"
            f" x {self.cache_type_v} [{type_size_text(self.cache_type_v)}])"
            f" = {self.total_bytes:,} bytes = {self.total_mib:.2f} MiB"
        )

    def as_dict(self) -> dict[str, Any]:
        return {
            "n_layer": self.shape.n_layer,
            "n_head_kv": list(self.shape.n_head_kv),
            "head_dim_k": self.shape.head_dim_k,
            "head_dim_v": self.shape.head_dim_v,
            "slots": self.slots,
            "ctx_per_slot": self.ctx_per_slot,
            "unified": self.unified,
            "cache_type_k": self.cache_type_k,
            "cache_type_v": self.cache_type_v,
            "type_size_k": type_size_text(self.cache_type_k),
            "type_size_v": type_size_text(self.cache_type_v),
            "n_ctx": self.n_ctx,
            "n_stream": self.n_stream,
            "cells_per_stream": self.cells_per_stream,
            "k_bytes": self.k_bytes,
            "v_bytes": self.v_bytes,
            "predicted_bytes": self.total_bytes,
            "predicted_mib": round(self.total_mib, 2),
            "shape_source": self.shape.source,
            "formula": self.formula(),
        }


def _tensor_bytes(elements_per_row: int, rows: int, cache_type: str) -> int:
    try:
        block, block_bytes = CACHE_TYPE_BLOCKS[cache_type]
    except KeyError:
        raise ModelError(
            f"unknown KV cache type {cache_type!r}", f"use one of {', '.join(CACHE_TYPE_BLOCKS)}"
        ) from None
    if elements_per_row % block:
        raise ModelError(
            f"KV row of {elements_per_row} elements is not a multiple of {cache_type}'s block {block}",
            "llama.cpp refuses this cache type for this model; use f16",
        )
    return rows * (elements_per_row // block) * block_bytes


def predict_kv(
    shape: KvShape,
    slots: int,
    ctx_per_slot: int,
    cache_type_k: str = "f16",
    cache_type_v: str = "f16",
    unified: bool = False,
) -> KvPrediction:
    """The KV bytes llama-server allocates for `-np slots -c slots*ctx_per_slot`."""
    n_ctx = pad_cells(slots * ctx_per_slot)
    n_stream = 1 if unified else slots
    cells = n_ctx if unified else pad_cells(n_ctx // slots)
    rows = n_stream * cells
    k_bytes = sum(_tensor_bytes(shape.head_dim_k * h, rows, cache_type_k) for h in shape.n_head_kv)
    v_bytes = sum(_tensor_bytes(shape.head_dim_v * h, rows, cache_type_v) for h in shape.n_head_kv)
    return KvPrediction(
        shape=shape,
        slots=slots,
        ctx_per_slot=ctx_per_slot,
        unified=unified,
        cache_type_k=cache_type_k,
        cache_type_v=cache_type_v,
        n_ctx=n_ctx if unified else cells * slots,
        n_stream=n_stream,
        cells_per_stream=cells,
        k_bytes=k_bytes,
        v_bytes=v_bytes,
    )
