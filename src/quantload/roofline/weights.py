"""Which weights a forward pass reads and multiplies, from a GGUF file's tensor table.

Every tensor is read once per forward pass (one generated token, or one micro-batch of a prompt)
with one exception: when the model has its own `output.weight`, the token-embedding table
`token_embd.weight` is only looked up, one row per token, and neither read whole nor multiplied.
When the two are tied (no `output.weight`), the table is the output projection and counts fully.
The output projection is kept apart because it only runs for tokens whose logits are wanted:
every generated token, but only the last token of each prompt batch in llama-bench's prefill.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from quantload.models.gguf_meta import GgufSummary
from quantload.models.gguf_scan import scan_gguf

EMBEDDING_TENSOR = "token_embd.weight"
OUTPUT_TENSOR = "output.weight"


@dataclass(frozen=True)
class WeightTraffic:
    """Weight bytes read and parameters multiplied by one forward pass, output projection apart."""

    bytes_per_pass: int
    matmul_params: int
    output_bytes: int
    output_params: int
    tied_embeddings: bool
    bits_per_weight: float


def traffic_from_tensors(tensors: Mapping[str, tuple[int, int]]) -> WeightTraffic:
    """Apply the rule above to {tensor name: (bytes, elements)}."""
    embedding = tensors.get(EMBEDDING_TENSOR, (0, 0))
    tied = OUTPUT_TENSOR not in tensors
    skipped_bytes, skipped_params = (0, 0) if tied else embedding
    output_bytes, output_params = embedding if tied else tensors[OUTPUT_TENSOR]
    total_bytes = sum(size for size, _ in tensors.values())
    total_params = sum(count for _, count in tensors.values())
    return WeightTraffic(
        bytes_per_pass=total_bytes - skipped_bytes,
        matmul_params=total_params - skipped_params,
        output_bytes=output_bytes,
        output_params=output_params,
        tied_embeddings=tied,
        bits_per_weight=8 * total_bytes / total_params if total_params else 0.0,
    )


def weight_traffic(summary: GgufSummary) -> WeightTraffic:
    """The weight traffic of the file `summary` describes (its tensor table is read again)."""
    return traffic_from_tensors(scan_gguf(summary.path).tensor_table())
