"""What a mixture-of-experts file is made of, from its own metadata and tensor table.

Every expert sits in memory, but each token is routed to `expert_used_count` of the
`expert_count` experts of each layer, so it multiplies (and, decoding, reads) only that share of
the expert tensors. Expert tensors are the routed ones, `*_exps` (`ffn_gate_exps`, `ffn_up_exps`,
`ffn_down_exps`, fused `ffn_gate_up_exps`); shared experts (`*_shexp`), the router
(`ffn_gate_inp`) and everything else are used by every token.

    active params = other params + expert params x used / count

A step of several sequences (batching) routes each token on its own, so it touches more of the
experts: with near-uniform routing the expected share of a layer's experts one step reads is
1 - (1 - used/count)^tokens (`touched_share`), all of them for a long prompt batch.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from quantload.errors import ModelError
from quantload.models.gguf_meta import GgufSummary
from quantload.models.gguf_scan import scan_gguf

EXPERT_TENSOR_MARK = "_exps."


def is_expert_tensor(name: str) -> bool:
    """Whether `name` is a routed expert tensor (only `expert_used_count` of its experts run)."""
    return EXPERT_TENSOR_MARK in name


def touched_share(used: int, count: int, tokens: int) -> float:
    """The expected share of one layer's experts that `tokens` tokens, each routed to `used` of
    `count` experts uniformly and on its own, touch together."""
    if count <= 0 or tokens <= 0:
        return 0.0
    return 1.0 - (1.0 - used / count) ** tokens


@dataclass(frozen=True)
class MoeFacts:
    """The experts of one MoE file: counts, and the parameters and bytes they hold."""

    expert_count: int
    expert_used_count: int
    total_params: int
    active_params: int
    expert_params: int
    expert_bytes: int
    other_bytes: int  # every tensor that is not a routed expert

    @property
    def used_share(self) -> float:
        return self.expert_used_count / self.expert_count

    def bytes_touched(self, tokens: int) -> float:
        """Expected weight bytes one step of `tokens` tokens reads (see `touched_share`)."""
        share = touched_share(self.expert_used_count, self.expert_count, tokens)
        return self.other_bytes + self.expert_bytes * share

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def moe_facts(summary: GgufSummary, tensors: Mapping[str, tuple[int, int]]) -> MoeFacts | None:
    """The MoE facts of a file ({tensor name: (bytes, elements)} its tensor table), or None for a
    dense model (no `expert_count`, or no routed expert tensor). ModelError when the metadata
    names experts but not how many a token uses, or more used than there are."""
    count = summary.arch_value("expert_count")
    expert = {name: sizes for name, sizes in tensors.items() if is_expert_tensor(name)}
    if not count or not expert:
        return None
    used = summary.arch_value("expert_used_count")
    if not used or int(used) > int(count):
        raise ModelError(
            f"{summary.path.name} has {count} experts but {summary.architecture}.expert_used_count"
            f" is {used!r}",
            "a mixture of experts must say how many of its experts each token uses",
        )
    count, used = int(count), int(used)
    expert_params = sum(elements for _, elements in expert.values())
    expert_bytes = sum(size for size, _ in expert.values())
    total_params = sum(elements for _, elements in tensors.values())
    total_bytes = sum(size for size, _ in tensors.values())
    active = total_params - expert_params + expert_params * used // count
    return MoeFacts(
        expert_count=count,
        expert_used_count=used,
        total_params=total_params,
        active_params=active,
        expert_params=expert_params,
        expert_bytes=expert_bytes,
        other_bytes=total_bytes - expert_bytes,
    )


def file_moe_facts(summary: GgufSummary) -> MoeFacts | None:
    """`moe_facts` of the file `summary` describes (its tensor table read again)."""
    if not summary.arch_value("expert_count"):
        return None
    return moe_facts(summary, scan_gguf(summary.path).tensor_table())
