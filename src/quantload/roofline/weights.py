"""Which weights one forward pass reads and multiplies, from a GGUF file's tensor list.

Every tensor is read once per forward pass (one generated token, or one micro-batch of a prompt)
with one exception: when the model has its own `output.weight`, the token-embedding table
`token_embd.weight` is only looked up, one row per token, and neither read whole nor multiplied.
When the two are tied (no `output.weight`), the table is the output projection and counts fully.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from quantload.errors import ModelError
from quantload.models.gguf_meta import GgufSummary

EMBEDDING_TENSOR = "token_embd.weight"
OUTPUT_TENSOR = "output.weight"


@dataclass(frozen=True)
class WeightTraffic:
    """Weight bytes read and parameters multiplied by one forward pass."""

    bytes_per_pass: int
    matmul_params: int
    tied_embeddings: bool
    embedding_bytes: int
    bits_per_weight: float


def traffic_from_tensors(tensors: Mapping[str, tuple[int, int]]) -> WeightTraffic:
    """Apply the rule above to {tensor name: (bytes, elements)}."""
    embedding_bytes, embedding_params = tensors.get(EMBEDDING_TENSOR, (0, 0))
    tied = OUTPUT_TENSOR not in tensors
    skipped_bytes, skipped_params = (0, 0) if tied else (embedding_bytes, embedding_params)
    total_bytes = sum(size for size, _ in tensors.values())
    total_params = sum(count for _, count in tensors.values())
    return WeightTraffic(
        bytes_per_pass=total_bytes - skipped_bytes,
        matmul_params=total_params - skipped_params,
        tied_embeddings=tied,
        embedding_bytes=embedding_bytes,
        bits_per_weight=8 * total_bytes / total_params if total_params else 0.0,
    )


def weight_traffic(summary: GgufSummary) -> WeightTraffic:
    """The weight traffic of the file `summary` describes (its tensor list is read again)."""
    import gguf  # heavy import, only when a file is read

    try:
        reader = gguf.GGUFReader(summary.path)
        tensors = {str(t.name): (int(t.n_bytes), int(t.n_elements)) for t in reader.tensors}
    except (ValueError, IndexError, KeyError, OSError) as error:
        raise ModelError(f"cannot read the tensors of {summary.path} ({error})") from None
    return traffic_from_tensors(tensors)
