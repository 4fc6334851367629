"""What one llama_decode call costs: the seam between measured cost curves and the simulation."""

from __future__ import annotations

from typing import Protocol


class BatchCost(Protocol):
    """Seconds llama-server spends on one batch (one llama_decode call over all its slots)."""

    def batch_s(self, prompt_tokens: int, decode_tokens: int, kv_tokens: int) -> float:
        """Seconds for a batch holding `prompt_tokens` prompt tokens (of any slots, after -b
        chunking) and `decode_tokens` generated positions (one per generating slot), where the
        sequences in the batch already hold `kv_tokens` tokens in the KV cache between them."""
        ...
