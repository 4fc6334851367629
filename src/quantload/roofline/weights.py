"""Which weights a forward pass reads and multiplies, from a GGUF file's tensor table.

Every tensor is read once per forward pass (one generated token, or one micro-batch of a prompt)
with one exception: when the model has its own `output.weight`, the token-embedding table
`token_embd.weight` is only looked up, one row per token, and neither read whole nor multiplied.
When the two are tied (no `output.weight`), the table is the output projection and counts fully.
The output projection is kept apart because it only runs for tokens whose logits are wanted:
every generated token, but only the last token of each prompt batch in llama-bench's prefill.

A mixture of experts (quantload.models.moe) multiplies only the experts each token is routed to:
`bytes_per_pass` and `matmul_params` count those (one token's share of the expert tensors), and
`bytes_for_tokens` says what a pass of several tokens reads, which touches more of the experts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from quantload.models.gguf_meta import GgufSummary
from quantload.models.gguf_scan import scan_gguf
from quantload.models.moe import is_expert_tensor, touched_share

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
    expert_bytes: int = 0  # all routed experts' bytes (0 for a dense model)
    experts_used: int = 0
    expert_count: int = 0

    def bytes_for_tokens(self, tokens: int) -> float:
        """Weight bytes one pass of `tokens` tokens reads: the experts any of them is routed to
        (expected, near-uniform routing) instead of one token's share."""
        if not self.expert_count:
            return float(self.bytes_per_pass)
        one_token = self.expert_bytes * self.experts_used / self.expert_count
        touched = self.expert_bytes * touched_share(self.experts_used, self.expert_count, tokens)
        return self.bytes_per_pass - one_token + touched


def traffic_from_tensors(
    tensors: Mapping[str, tuple[int, int]], experts_used: int = 0, expert_count: int = 0
) -> WeightTraffic:
    """Apply the rule above to {tensor name: (bytes, elements)}; with `expert_count`, each token
    reads and multiplies `experts_used` / `expert_count` of the routed expert tensors."""
    embedding = tensors.get(EMBEDDING_TENSOR, (0, 0))
    tied = OUTPUT_TENSOR not in tensors
    skipped_bytes, skipped_params = (0, 0) if tied else embedding
    output_bytes, output_params = embedding if tied else tensors[OUTPUT_TENSOR]
    total_bytes = sum(size for size, _ in tensors.values())
    total_params = sum(count for _, count in tensors.values())
    expert_bytes = expert_params = 0
    if expert_count:
        expert_bytes = sum(size for name, (size, _) in tensors.items() if is_expert_tensor(name))
        expert_params = sum(count for name, (_, count) in tensors.items() if is_expert_tensor(name))
    unused = (expert_count - experts_used) / expert_count if expert_count else 0.0
    return WeightTraffic(
        bytes_per_pass=total_bytes - skipped_bytes - round(expert_bytes * unused),
        matmul_params=total_params - skipped_params - round(expert_params * unused),
        output_bytes=output_bytes,
        output_params=output_params,
        tied_embeddings=tied,
        bits_per_weight=8 * total_bytes / total_params if total_params else 0.0,
        expert_bytes=expert_bytes,
        experts_used=experts_used if expert_count else 0,
        expert_count=expert_count,
    )


def weight_traffic(summary: GgufSummary) -> WeightTraffic:
    """The weight traffic of the file `summary` describes (its tensor table is read again)."""
    count = int(summary.arch_value("expert_count", 0) or 0)
    used = int(summary.arch_value("expert_used_count", 0) or 0)
    if not 0 < used <= count:
        count = used = 0
    return traffic_from_tensors(scan_gguf(summary.path).tensor_table(), used, count)
