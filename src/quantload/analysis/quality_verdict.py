"""The verdict at a quality limit: of the quantizations whose quality loss is within
`report.max_kld_mean_nats`, the one that serves the most users within the SLO.

It is computed from the capacity verdicts as they are (`CapacityVerdict.held_users`: the limit
search's where the run searched, else the sweep's) and the KL divergences of quality.json, taken
with the KV-cache type the servers ran (K and V alike; f16 otherwise). Equal capacities are told
apart by the smaller quality loss: serving as many users for less loss is the better choice.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from quantload.analysis import fmt
from quantload.analysis.capacity import CapacityVerdict
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
    return f"{fmt.number(value, KLD_DIGITS)} nats"


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
) -> str:
    users = best.held_users
    assert users is not None
    text = (
        f"Within {words}, {best.quant} serves the most users within the SLO: up to"
        f" {_users(users)}, at a mean KLD of {_nats(loss[best.quant].kld_mean_nats)}"
    )
    tied = [v.quant for v in within if v.quant != best.quant and v.held_users == users]
    if tied:
        verb = "serves" if len(tied) == 1 else "serve"
        text += f" ({', '.join(tied)} {verb} as many and lose{'s' if len(tied) == 1 else ''} more,"
        text += f" so {best.quant} is chosen)"
    swept_only = best.searched_users is None  # the search names its own ceiling in its sentence
    if swept_only and best.tested_users and users >= max(best.tested_users):
        text += "; that is the highest level tested, so its limit may lie higher"
    more = [v for v in over if v.held_users is not None and v.held_users > users]
    if more:
        text += "; " + ", ".join(
            f"{v.quant} would serve {_users(v.held_users or 0)}"
            f" but loses {_nats(loss[v.quant].kld_mean_nats)}"
            for v in more
        )
    return text + "."


def quality_verdict(
    verdicts: Sequence[CapacityVerdict],
    kld: KldSet | None,
    limit_nats: float,
    cache_type_k: str | None = None,
    cache_type_v: str | None = None,
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
    serving = [v for v in within if v.held_users is not None]
    best = max(serving, key=lambda v: (v.held_users or 0, -loss[v.quant].kld_mean_nats), default=None)
    if best is not None:
        sentence = _chosen_sentence(best, loss, within, over, words)
    elif within:
        sentence = (
            f"Of the quantizations within {words} ({', '.join(v.quant for v in within)}), none meets"
            " the SLO at any level tested."
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
