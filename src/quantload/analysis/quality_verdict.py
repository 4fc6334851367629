"""The verdict at a quality limit: of the quantizations whose quality loss is within
`report.max_kld_mean_nats`, the one that serves the most users within the SLO.

It is computed from the capacity verdicts as they are (`CapacityVerdict.held_users`: the most users
shown to meet the SLO, the limit search's where the run searched, else the sweep's; no choice
rests on an undecided level) and the KL divergences of quality.json, taken with the KV-cache type
the servers ran (K and V alike; f16 otherwise). Capacities are compared as decided
(quantload.comparison): one quantization serves more than another only where it met the SLO at a
level the other was shown to miss; capacities the data cannot tell apart are ties, and of tied
ones the smaller quality loss is the better choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from quantload.analysis import fmt
from quantload.analysis.capacity import CapacityVerdict
from quantload.comparison import compare_limits
from quantload.quality.kld_results import FLOOR_CACHE_TYPE, KldResult, KldSet

KLD_DIGITS = 6  # as llama-perplexity prints it


@dataclass(frozen=True)
class QualityVerdict:
    """The choice at the quality limit, what was in and out of it, and the sentence that says it."""

    max_kld_mean_nats: float
    cache_type: str
    quant: str | None
    max_users: int | None
    kld_mean_nats: float | None
    within_limit: tuple[str, ...]
    over_limit: tuple[str, ...]
    not_measured: tuple[str, ...]
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def judged_cache_type(cache_type_k: str | None, cache_type_v: str | None, kld: KldSet) -> str:
    """The KV-cache type whose KLDs describe what was served: the servers' own when K and V are
    the same type and it was measured, else f16 (the weights' loss alone)."""
    if cache_type_k is not None and cache_type_k == cache_type_v and kld.for_cache_type(cache_type_k):
        return cache_type_k
    return FLOOR_CACHE_TYPE


def _nats(value: float) -> str:
    return f"{fmt.number(max(0.0, value), KLD_DIGITS)} nats"  # below zero: llama-perplexity's rounding


def _users(count: int) -> str:
    return f"{count} concurrent user{'s' if count != 1 else ''}"


def _limit_words(limit: float, cache_type: str) -> str:
    kv = "" if cache_type == FLOOR_CACHE_TYPE else f", with the {cache_type} KV cache served"
    return f"a quality loss of at most {limit:g} nats mean KLD from F16 (report.max_kld_mean_nats{kv})"


def _chosen_sentence(
    best: CapacityVerdict,
    loss: dict[str, KldResult],
    within: Sequence[CapacityVerdict],
    over: Sequence[CapacityVerdict],
    words: str,
    confidence: float,
) -> str:
    users = best.held_users
    assert users is not None
    text = (
        f"Within {words}, {best.quant} is chosen: it serves up to {_users(users)} within the SLO, at a"
        f" mean KLD of {_nats(loss[best.quant].kld_mean_nats)}"
    )
    said = []
    for other in within:
        if other.quant == best.quant:
            continue
        comparison = compare_limits(best.limit_range(), other.limit_range(), confidence)
        said.append(comparison.text(best.quant, other.quant))
        if not comparison.shown and other.held_users is not None:
            said[-1] += f"; {other.quant} loses more" if _loses_more(other, best, loss) else ""
    if said:
        text += " (" + "; ".join(said) + ")"
    swept_only = best.searched_users is None  # the search names its own ceiling in its sentence
    if swept_only and best.tested_users and users >= max(best.tested_users):
        text += "; that is the highest level tested, so its limit may lie higher"
    for other in over:
        comparison = compare_limits(other.limit_range(), best.limit_range(), confidence)
        if comparison.better == "a":
            text += (
                f"; {other.quant} would serve more ({comparison.text(other.quant, best.quant)})"
                f" but loses {_nats(loss[other.quant].kld_mean_nats)}"
            )
    return text + "."


def _loses_more(other: CapacityVerdict, best: CapacityVerdict, loss: dict[str, KldResult]) -> bool:
    return loss[other.quant].kld_mean_nats > loss[best.quant].kld_mean_nats


def _choose(
    within: Sequence[CapacityVerdict], loss: dict[str, KldResult], confidence: float
) -> CapacityVerdict | None:
    """Of the quantizations within the quality limit with a decided capacity, those no other beats,
    and of them the one with the smallest quality loss."""
    serving = [v for v in within if v.held_users is not None]
    if not serving:
        return None

    def beaten(v: CapacityVerdict) -> bool:
        return any(
            compare_limits(o.limit_range(), v.limit_range(), confidence).better == "a"
            for o in serving
            if o is not v
        )

    unbeaten = [v for v in serving if not beaten(v)]
    pool = unbeaten or serving
    return min(pool, key=lambda v: (loss[v.quant].kld_mean_nats, -(v.held_users or 0)))


def quality_verdict(
    verdicts: Sequence[CapacityVerdict],
    kld: KldSet | None,
    limit_nats: float,
    cache_type_k: str | None = None,
    cache_type_v: str | None = None,
    confidence: float = 0.95,
) -> QualityVerdict:
    """The quantization serving the most users within the SLO at quality loss <= `limit_nats`."""
    quants = tuple(v.quant for v in verdicts)
    if kld is None:
        return QualityVerdict(
            limit_nats, FLOOR_CACHE_TYPE, None, None, None, (), (), quants,
            "Quality loss (KL divergence from F16) was not measured, so no quantization can be"
            " chosen at a quality limit: run with quality.kld on.",
        )  # fmt: skip
    cache_type = judged_cache_type(cache_type_k, cache_type_v, kld)
    loss = kld.for_cache_type(cache_type)
    words = _limit_words(limit_nats, cache_type)
    within = [v for v in verdicts if v.quant in loss and loss[v.quant].kld_mean_nats <= limit_nats]
    over = [v for v in verdicts if v.quant in loss and loss[v.quant].kld_mean_nats > limit_nats]
    unmeasured = tuple(v.quant for v in verdicts if v.quant not in loss)
    best = _choose(within, loss, confidence)
    if best is not None:
        sentence = _chosen_sentence(best, loss, within, over, words, confidence)
    elif within:
        sentence = (
            f"Of the quantizations within {words} ({', '.join(v.quant for v in within)}), none was shown"
            " to meet the SLO at any level tested."
        )
    else:
        sentence = f"No quantization measured stays within {words}." + (
            " Over it: " + ", ".join(f"{v.quant} {_nats(loss[v.quant].kld_mean_nats)}" for v in over) + "."
            if over
            else ""
        )
    if unmeasured:
        sentence += f" Not judged (no KLD measured): {', '.join(unmeasured)}."
    return QualityVerdict(
        max_kld_mean_nats=limit_nats,
        cache_type=cache_type,
        quant=best.quant if best else None,
        max_users=best.held_users if best else None,
        kld_mean_nats=loss[best.quant].kld_mean_nats if best else None,
        within_limit=tuple(v.quant for v in within),
        over_limit=tuple(v.quant for v in over),
        not_measured=unmeasured,
        sentence=sentence,
    )
