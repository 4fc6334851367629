"""A tiny Qwen2-architecture model with random weights, for tests that must serve a real model.

It carries the real Qwen2 tokenizer and chat template (copied from `models/ggml-vocab-qwen2.gguf`
in the llama.cpp tree), so prompts tokenize as they would for Qwen2.5. The weights are random, so
its perplexity is about the vocabulary size and its replies are noise; what matters is that
llama-server, llama-quantize, llama-bench and llama-perplexity all treat it as a real model.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from quantload.errors import ModelError

VOCAB_FILE = "models/ggml-vocab-qwen2.gguf"
_COPIED_TOKENIZER_KEYS = (
    "tokenizer.ggml.model",
    "tokenizer.ggml.pre",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges",
    "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.bos_token_id",
    "tokenizer.ggml.padding_token_id",
    "tokenizer.chat_template",
)


@dataclass(frozen=True)
class TinyShape:
    """Hyperparameters of the synthetic model; hidden sizes stay multiples of 256 for Q4_K_M."""

    embedding: int = 256
    heads: int = 4
    kv_heads: int = 2
    layers: int = 2
    feed_forward: int = 512
    context: int = 32768


def _tokenizer_fields(vocab_path: Path) -> dict[str, object]:
    import gguf

    if not vocab_path.is_file():
        raise ModelError(f"vocabulary file {vocab_path} is missing", "run 'quantload toolchain' first")
    reader = gguf.GGUFReader(vocab_path)
    return {key: reader.fields[key].contents() for key in _COPIED_TOKENIZER_KEYS}


def random_weights(rng: np.random.Generator, *shape: int) -> np.ndarray:
    """Small random f16 weights; numpy (rows, cols) is ggml {cols, rows}."""
    return (rng.standard_normal(shape, dtype=np.float32) * 0.02).astype(np.float16)


def ones(n: int) -> np.ndarray:
    """A norm's weights."""
    return np.ones(n, dtype=np.float32)


def start_writer(out_path: Path, architecture: str, name: str, llama_tree: Path) -> tuple[Any, int]:
    """A GGUF writer of `architecture` holding the Qwen2 tokenizer and chat template, and the
    vocabulary's size."""
    import gguf

    fields = _tokenizer_fields(llama_tree / VOCAB_FILE)
    tokens = fields["tokenizer.ggml.tokens"]
    assert isinstance(tokens, list)
    writer = gguf.GGUFWriter(str(out_path), architecture)
    writer.add_name(name)
    writer.add_file_type(int(gguf.LlamaFileType.MOSTLY_F16))
    writer.add_tokenizer_model(str(fields["tokenizer.ggml.model"]))
    writer.add_tokenizer_pre(str(fields["tokenizer.ggml.pre"]))
    writer.add_token_list(tokens)
    token_types, merges = fields["tokenizer.ggml.token_type"], fields["tokenizer.ggml.merges"]
    assert isinstance(token_types, list) and isinstance(merges, list)
    writer.add_token_types(token_types)
    writer.add_token_merges(merges)
    writer.add_eos_token_id(int(fields["tokenizer.ggml.eos_token_id"]))  # type: ignore[call-overload]
    writer.add_bos_token_id(int(fields["tokenizer.ggml.bos_token_id"]))  # type: ignore[call-overload]
    writer.add_pad_token_id(int(fields["tokenizer.ggml.padding_token_id"]))  # type: ignore[call-overload]
    writer.add_chat_template(str(fields["tokenizer.chat_template"]))
    return writer, len(tokens)


def finish_writer(writer: Any) -> None:
    """Write the header, the metadata and the tensors, and close the file."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def write_tiny_model(llama_tree: Path, out_path: Path, seed: int = 0, shape: TinyShape | None = None) -> Path:
    """Write the synthetic model as F16 GGUF to `out_path` (deterministic for a given seed)."""
    shape = shape or TinyShape()
    writer, n_vocab = start_writer(out_path, "qwen2", f"quantload tiny qwen2 (seed {seed})", llama_tree)
    rng = np.random.default_rng(seed)
    e, ff = shape.embedding, shape.feed_forward
    head_dim = e // shape.heads
    kv = shape.kv_heads * head_dim

    def weights(rows: int, cols: int) -> np.ndarray:
        return random_weights(rng, rows, cols)

    writer.add_context_length(shape.context)
    writer.add_embedding_length(e)
    writer.add_block_count(shape.layers)
    writer.add_feed_forward_length(ff)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_layer_norm_rms_eps(1e-6)
    writer.add_rope_freq_base(1_000_000.0)

    writer.add_tensor("token_embd.weight", weights(n_vocab, e))
    writer.add_tensor("output_norm.weight", ones(e))
    for layer in range(shape.layers):
        prefix = f"blk.{layer}"
        writer.add_tensor(f"{prefix}.attn_norm.weight", ones(e))
        writer.add_tensor(f"{prefix}.attn_q.weight", weights(e, e))
        writer.add_tensor(f"{prefix}.attn_k.weight", weights(kv, e))
        writer.add_tensor(f"{prefix}.attn_v.weight", weights(kv, e))
        writer.add_tensor(f"{prefix}.attn_output.weight", weights(e, e))
        writer.add_tensor(f"{prefix}.ffn_norm.weight", ones(e))
        writer.add_tensor(f"{prefix}.ffn_gate.weight", weights(ff, e))
        writer.add_tensor(f"{prefix}.ffn_up.weight", weights(ff, e))
        writer.add_tensor(f"{prefix}.ffn_down.weight", weights(e, ff))
    finish_writer(writer)
    return out_path
