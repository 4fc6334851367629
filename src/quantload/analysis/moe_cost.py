"""What a mixture of experts costs, set beside dense models of its total and of its active size.

All three are held in memory whole, so weight memory follows the total size. Decoding one
sequence reads, per token, the weights it multiplies: the MoE only its routed experts' share
(quantload.models.moe), so its decode should run near the dense model of its active size, not the
one of its total size. A step of several sequences routes each token on its own and touches more
experts (1 - (1 - used/count)^sequences of them): the bytes a step reads grow towards the total
with the number of users, while a dense model's stay the same, so batching erodes the MoE's lead.

`follows` places a measured MoE figure between its two dense twins on a log scale: 0 at the total
twin's figure, 1 at the active twin's (outside [0, 1] when it is beyond either).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from quantload.models.moe import touched_share

FOLLOWS_ACTIVE = 0.5  # a position at or above this follows the active size


@dataclass(frozen=True)
class ModelCost:
    """One model of the comparison: its size and what was measured of it."""

    label: str
    role: str  # "moe", "dense-total", "dense-active"
    file_bytes: int
    total_params: int
    active_params: int
    token_bytes: float  # weight bytes one generated token reads (one sequence)
    expert_bytes: int = 0  # all routed experts' bytes (0: dense)
    experts_used: int = 0
    expert_count: int = 0
    decode_tok_s: Mapping[int, float] = field(default_factory=dict)  # users -> output tok/s, all users
    prefill_tok_s: Mapping[int, float] = field(default_factory=dict)  # users -> prompt tok/s per request
    bench_decode_tok_s: float | None = None  # llama-bench tg, one sequence
    bench_prefill_tok_s: float | None = None  # llama-bench pp
    decode_ceiling_tok_s: float | None = None  # the roofline's decode ceiling (the lower one)
    decode_bound: str = ""  # which limit that ceiling is: memory or compute

    def step_bytes(self, users: int) -> float:
        """Weight bytes one decode step of `users` sequences reads (expected, uniform routing)."""
        if not self.expert_count:
            return self.token_bytes
        one = self.expert_bytes * self.experts_used / self.expert_count
        touched = self.expert_bytes * touched_share(self.experts_used, self.expert_count, users)
        return self.token_bytes - one + touched


def follows(moe: float | None, dense_total: float | None, dense_active: float | None) -> float | None:
    """Where `moe` sits between the total twin's figure (0) and the active twin's (1), log scale;
    None when a figure is missing or the twins do not differ."""
    if not moe or not dense_total or not dense_active or dense_total == dense_active:
        return None
    return math.log(moe / dense_total) / math.log(dense_active / dense_total)


def follows_words(position: float | None) -> str:
    """The verdict in words."""
    if position is None:
        return "not decided (a figure is missing)"
    size = "active" if position >= FOLLOWS_ACTIVE else "total"
    return f"follows the {size} size (at {position:.2f} of the way from the total twin to the active twin)"


@dataclass(frozen=True)
class Comparison:
    """The MoE and its two dense twins."""

    moe: ModelCost
    dense_total: ModelCost
    dense_active: ModelCost

    @property
    def models(self) -> tuple[ModelCost, ModelCost, ModelCost]:
        return (self.moe, self.dense_total, self.dense_active)

    def decode_follows(self, users: int) -> float | None:
        return follows(
            self.moe.decode_tok_s.get(users),
            self.dense_total.decode_tok_s.get(users),
            self.dense_active.decode_tok_s.get(users),
        )

    def bench_follows(self) -> float | None:
        moe, total, active = (model.bench_decode_tok_s for model in self.models)
        return follows(moe, total, active)

    def lead_over_total(self, users: int) -> float | None:
        """The MoE's decode tok/s over the total twin's at `users` (how much faster it is)."""
        moe, total = self.moe.decode_tok_s.get(users), self.dense_total.decode_tok_s.get(users)
        return moe / total if moe and total else None

    def sentences(self, users: Sequence[int]) -> list[str]:
        """What the report says: whether decode follows the active or the total size at each
        user count, and how batching changes it."""
        said = [f"llama-bench decode, one sequence: {follows_words(self.bench_follows())}."]
        for count in users:
            verdict = follows_words(self.decode_follows(count))
            said.append(f"served decode at {count} user{'s' * (count > 1)}: {verdict}.")
        measured = [c for c in users if self.lead_over_total(c) is not None]
        if len(measured) >= 2:
            first, last = measured[0], measured[-1]
            lead_first, lead_last = self.lead_over_total(first), self.lead_over_total(last)
            assert lead_first is not None and lead_last is not None
            share_first = touched_share(self.moe.experts_used, self.moe.expert_count, first)
            share_last = touched_share(self.moe.experts_used, self.moe.expert_count, last)
            said.append(
                f"batching: a decode step of {first} sequence{'s' * (first > 1)} touches"
                f" {share_first:.0%} of each layer's experts, of {last} {share_last:.0%}"
                f" (uniform routing); the MoE's decode lead over its total twin goes from"
                f" {lead_first:.2f}x at {first} to {lead_last:.2f}x at {last} users."
            )
        return said


def markdown_table(comparison: Comparison, users: Sequence[int]) -> list[str]:
    """The comparison as Markdown table lines."""
    head = [
        "model", "file MB", "params M (active)", "MB read / token",
        *(f"MB read / step at {u}" for u in users[1:]),
        "bench tg tok/s", "tg ceiling tok/s (bound)", "bench pp tok/s",
        *(f"decode tok/s at {u}" for u in users), *(f"prefill tok/s at {u}" for u in users),
    ]  # fmt: skip
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for model in comparison.models:
        cells = [
            f"{model.label} ({model.role})",
            f"{model.file_bytes / 1e6:,.1f}",
            f"{model.total_params / 1e6:,.1f} ({model.active_params / 1e6:,.1f})",
            f"{model.token_bytes / 1e6:,.1f}",
            *(f"{model.step_bytes(u) / 1e6:,.1f}" for u in users[1:]),
            _num(model.bench_decode_tok_s),
            f"{_num(model.decode_ceiling_tok_s)} ({model.decode_bound or '-'})",
            _num(model.bench_prefill_tok_s),
            *(_num(model.decode_tok_s.get(u)) for u in users),
            *(_num(model.prefill_tok_s.get(u)) for u in users),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _num(value: float | None) -> str:
    return "-" if value is None else f"{value:,.1f}"
