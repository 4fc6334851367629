"""A tiny Qwen3-MoE model with random weights, and the dense models it is measured against.

`write_tiny_moe` writes a `qwen3moe` GGUF the way `quantload.models.synthetic` writes the tiny
dense model (the Qwen2 tokenizer and chat template, f16 weights): per block the Qwen3 attention
(`attn_q/k/v/output` with `attn_q_norm`/`attn_k_norm`), a router `ffn_gate_inp` {n_embd, n_expert}
and the experts `ffn_{gate,up}_exps` {n_embd, n_ff_exp, n_expert} and `ffn_down_exps` {n_ff_exp,
n_embd, n_expert}, with `expert_count`, `expert_used_count` and `expert_feed_forward_length` in
the metadata (src/models/qwen3moe.cpp of the pinned llama.cpp).

`write_dense_twin` writes a `qwen3` model of the same attention, embedding and layers whose one
feed-forward block is as large as all the experts together ("total") or as the experts a token
uses ("active"): the two dense models an MoE's cost is set beside. Random router weights send
tokens to experts almost uniformly: right for memory, speed and placement, not for expert skew or
quality. Dimensions stay multiples of 256 so the k-quants apply to every matrix.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from quantload.errors import ModelError
from quantload.models.synthetic import finish_writer, ones, random_weights, start_writer

TwinSize = Literal["total", "active"]
K_QUANT_BLOCK = 256


@dataclass(frozen=True)
class MoeShape:
    """Hyperparameters of the synthetic MoE (head dimension = embedding / heads)."""

    embedding: int = 256
    heads: int = 4
    kv_heads: int = 2
    layers: int = 2
    experts: int = 4
    experts_used: int = 2
    expert_feed_forward: int = 256
    context: int = 32768

    @property
    def head_dim(self) -> int:
        return self.embedding // self.heads

    def check(self) -> None:
        """ModelError naming the first hyperparameter llama.cpp or the k-quants would refuse."""
        if not 0 < self.experts_used <= self.experts:
            raise ModelError(
                f"a tiny MoE with {self.experts} experts cannot use {self.experts_used} per token",
                "use between 1 and the expert count",
            )
        for name, value in (("embedding", self.embedding), ("expert_feed_forward", self.expert_feed_forward)):
            if value % K_QUANT_BLOCK:
                raise ModelError(f"{name} {value} is not a multiple of {K_QUANT_BLOCK}", "k-quants need it")
        if self.embedding % self.heads or self.heads % self.kv_heads:
            raise ModelError(
                f"{self.heads} heads and {self.kv_heads} KV heads do not divide embedding {self.embedding}",
                "pick heads that divide the embedding and KV heads that divide the heads",
            )


def twin_feed_forward(shape: MoeShape, size: TwinSize) -> int:
    """The dense twin's feed-forward width: every expert's ("total") or the used ones' ("active")."""
    count = shape.experts if size == "total" else shape.experts_used
    return count * shape.expert_feed_forward


def _attention(writer: Any, rng: np.random.Generator, shape: MoeShape, prefix: str) -> None:
    e, head_dim = shape.embedding, shape.head_dim
    kv = shape.kv_heads * head_dim
    add = writer.add_tensor
    add(f"{prefix}.attn_norm.weight", ones(e))
    add(f"{prefix}.attn_q.weight", random_weights(rng, shape.heads * head_dim, e))
    add(f"{prefix}.attn_k.weight", random_weights(rng, kv, e))
    add(f"{prefix}.attn_v.weight", random_weights(rng, kv, e))
    add(f"{prefix}.attn_output.weight", random_weights(rng, e, shape.heads * head_dim))
    add(f"{prefix}.attn_q_norm.weight", ones(head_dim))
    add(f"{prefix}.attn_k_norm.weight", ones(head_dim))
    add(f"{prefix}.ffn_norm.weight", ones(e))


def _hyperparameters(writer: Any, shape: MoeShape, feed_forward: int) -> None:
    w = writer
    w.add_context_length(shape.context)
    w.add_embedding_length(shape.embedding)
    w.add_block_count(shape.layers)
    w.add_feed_forward_length(feed_forward)
    w.add_head_count(shape.heads)
    w.add_head_count_kv(shape.kv_heads)
    w.add_key_length(shape.head_dim)
    w.add_value_length(shape.head_dim)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(1_000_000.0)


def write_tiny_moe(llama_tree: Path, out_path: Path, seed: int = 0, shape: MoeShape | None = None) -> Path:
    """Write the synthetic qwen3moe model as F16 GGUF to `out_path` (deterministic per seed)."""
    shape = shape or MoeShape()
    shape.check()
    experts = f"{shape.experts}x{shape.expert_feed_forward} top-{shape.experts_used}"
    name = f"quantload tiny qwen3moe {experts} (seed {seed})"
    writer, n_vocab = start_writer(out_path, "qwen3moe", name, llama_tree)
    _hyperparameters(writer, shape, shape.expert_feed_forward)
    writer.add_expert_count(shape.experts)
    writer.add_expert_used_count(shape.experts_used)
    writer.add_expert_feed_forward_length(shape.expert_feed_forward)
    rng = np.random.default_rng(seed)
    e, ff, n = shape.embedding, shape.expert_feed_forward, shape.experts
    writer.add_tensor("token_embd.weight", random_weights(rng, n_vocab, e))
    writer.add_tensor("output_norm.weight", ones(e))
    for layer in range(shape.layers):
        prefix = f"blk.{layer}"
        _attention(writer, rng, shape, prefix)
        writer.add_tensor(f"{prefix}.ffn_gate_inp.weight", random_weights(rng, n, e).astype(np.float32))
        writer.add_tensor(f"{prefix}.ffn_gate_exps.weight", random_weights(rng, n, ff, e))
        writer.add_tensor(f"{prefix}.ffn_up_exps.weight", random_weights(rng, n, ff, e))
        writer.add_tensor(f"{prefix}.ffn_down_exps.weight", random_weights(rng, n, e, ff))
    finish_writer(writer)
    return out_path


def write_dense_twin(
    llama_tree: Path, out_path: Path, size: TwinSize, seed: int = 0, shape: MoeShape | None = None
) -> Path:
    """Write the qwen3 model of `shape`'s attention and a dense feed-forward block as large as all
    its experts (`total`) or as the ones a token uses (`active`), as F16 GGUF."""
    shape = shape or MoeShape()
    shape.check()
    ff = twin_feed_forward(shape, size)
    experts = f"{shape.experts}x{shape.expert_feed_forward} top-{shape.experts_used}"
    name = f"quantload tiny qwen3 dense, the {size} size of {experts} (seed {seed})"
    writer, n_vocab = start_writer(out_path, "qwen3", name, llama_tree)
    _hyperparameters(writer, shape, ff)
    rng = np.random.default_rng(seed)
    e = shape.embedding
    writer.add_tensor("token_embd.weight", random_weights(rng, n_vocab, e))
    writer.add_tensor("output_norm.weight", ones(e))
    for layer in range(shape.layers):
        prefix = f"blk.{layer}"
        _attention(writer, rng, shape, prefix)
        writer.add_tensor(f"{prefix}.ffn_gate.weight", random_weights(rng, ff, e))
        writer.add_tensor(f"{prefix}.ffn_up.weight", random_weights(rng, ff, e))
        writer.add_tensor(f"{prefix}.ffn_down.weight", random_weights(rng, e, ff))
    finish_writer(writer)
    return out_path
