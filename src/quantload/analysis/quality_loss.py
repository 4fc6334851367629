"""Quality loss against F16, from quality.json's KL divergences: a row and one sentence per
quantization, the floor beside each, and what the reference file is.

Every figure is the weights' own loss: the KLD measured with an f16 KV cache (the cache type the
base logits were written with). A quantization's sentence says how far it is from F16, whether
that is beyond the floor's uncertainty, and whether its difference from the next quantization in
the run's order is beyond the uncertainty (`beyond_uncertainty`: more than two combined standard
errors, each the larger of llama-perplexity's per-token one and the per-chunk one).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.quality.kld_results import (
    FLOOR_CACHE_TYPE,
    KldBase,
    KldResult,
    KldSet,
    beyond_uncertainty,
    mean_error_nats,
    standard_errors_apart,
)

SIGMAS = 2.0  # beyond_uncertainty's default
KLD_DIGITS = 6  # as llama-perplexity prints it

QUALITY_LOSS_COLUMNS: tuple[str, ...] = (
    "quant", "cache_type", "is_floor", "kld_mean_nats", "kld_mean_error_nats", "kld_median_nats",
    "kld_p99_nats", "kld_p99_9_nats", "same_top_p_pct", "same_top_p_error_pct", "delta_p_rms_pct",
    "ppl_change_pct", "ppl_change_error_pct", "chunks_scored", "tokens_scored",
    "beyond_floor", "next_quant", "beyond_next", "standard_errors_from_next",
)  # fmt: skip


@dataclass(frozen=True)
class QualityLoss:
    """The quality-loss section's content; empty (and `missing` says why) when KLD was not measured."""

    rows: pd.DataFrame  # QUALITY_LOSS_COLUMNS, one row per (quantization, KV-cache type)
    sentences: tuple[str, ...]
    reference: str | None
    floor_kld_mean_nats: float | None
    missing: str | None

    def to_dict(self) -> dict[str, Any]:
        return {
            "reference": self.reference,
            "floor_kld_mean_nats": self.floor_kld_mean_nats,
            "sentences": list(self.sentences),
            "missing": self.missing,
        }


def nats_shown(kld_nats: float | None) -> str:
    """A mean KLD as llama-perplexity prints it, six decimals; one below zero (llama-perplexity's
    rounding: a divergence is never negative) shows as 0.000000."""
    if kld_nats is None:
        return fmt.DASH
    return fmt.number(max(0.0, kld_nats), KLD_DIGITS)


def kld_text(result: KldResult) -> str:
    """'0.004119 ± 0.000165 nats' (the larger standard error), as llama-perplexity prints it."""
    error = mean_error_nats(result)
    mean = nats_shown(result.kld_mean_nats)
    return f"{mean} ± {fmt.number(error, KLD_DIGITS)} nats" if error is not None else f"{mean} nats"


def _ppl_change_text(result: KldResult) -> str:
    change = fmt.number(result.ppl_change_pct, 2)
    sign = "+" if result.ppl_change_pct >= 0 else ""
    error = result.ppl_change_error_pct
    return f"{sign}{change} %" + (f" ± {fmt.number(error, 2)} %" if error is not None else "")


def reference_text(base: KldBase) -> str:
    """What the KLDs are measured against, with the model source's note where it has one."""
    text = (
        f"Every KL divergence is measured against the run's {base.quant} file"
        f" ({Path(base.model_path).name}) on {fmt.counted(base.chunks_scored, 'chunk')}"
        f" of {base.ctx_tokens} tokens of {base.dataset.name}"
        f" ({base.tokens_scored:,} tokens scored)"
    )
    if base.source_note:
        note = base.source_note.rstrip(".")
        return (
            f"{text}. That file's source note: {note}. So these KLDs measure the loss relative to"
            f" that {base.quant} file, not to the original model, as the perplexity figures do."
        )
    return text + "."


def _ordered(per_quant: Mapping[str, object], quants: Sequence[str]) -> list[str]:
    return [q for q in quants if q in per_quant] + [q for q in per_quant if q not in quants]


def _comparison(this: KldResult, label: str, other: KldResult, other_label: str) -> str:
    apart = standard_errors_apart(this, other)
    apart_text = "" if apart is None or apart == float("inf") else f", {apart:.1f} standard errors apart"
    if beyond_uncertainty(this, other, SIGMAS):
        more = other_label if other.kld_mean_nats > this.kld_mean_nats else label
        return (
            f"the difference from {other_label} ({nats_shown(other.kld_mean_nats)}) is"
            f" beyond the uncertainty ({more} loses more{apart_text})"
        )
    return (
        f"the difference from {other_label} ({nats_shown(other.kld_mean_nats)}) is within"
        f" the uncertainty (these chunks cannot tell them apart{apart_text})"
    )


def _floor_sentence(floor: KldResult) -> str:
    return (
        f"{floor.quant} against its own base is the floor: mean KLD {kld_text(floor)}, same top token"
        f" {fmt.number(floor.same_top_p_pct, 2)} %: what storing the base logits in 16 bits alone"
        " leaves, the figure every other file is judged against."
    )


def _sentence(
    label: str, result: KldResult, floor: KldResult | None, following: tuple[str, KldResult] | None
) -> str:
    parts = [f"{label}: mean KLD {kld_text(result)} from F16"]
    if floor is not None:
        parts[0] += f" (floor {nats_shown(floor.kld_mean_nats)})"
    parts[0] += (
        f", same top token {fmt.number(result.same_top_p_pct, 2)} %,"
        f" perplexity {_ppl_change_text(result)} against F16's own"
    )
    if floor is not None:
        beyond = beyond_uncertainty(result, floor, SIGMAS)
        parts.append("beyond the floor's uncertainty" if beyond else "within the floor's uncertainty")
    if following is None:
        parts.append("the last quantization measured")
    else:
        parts.append(_comparison(result, label, following[1], following[0]))
    return "; ".join(parts) + "."


def _row(
    label: str, result: KldResult, floor: KldResult | None, following: tuple[str, KldResult] | None
) -> dict[str, Any]:
    return {
        "quant": label,
        "cache_type": result.cache_type_v,
        "is_floor": result.is_floor,
        "kld_mean_nats": result.kld_mean_nats,
        "kld_mean_error_nats": mean_error_nats(result),
        "kld_median_nats": result.kld_median_nats,
        "kld_p99_nats": result.kld_p99_nats,
        "kld_p99_9_nats": result.kld_p99_9_nats,
        "same_top_p_pct": result.same_top_p_pct,
        "same_top_p_error_pct": result.same_top_p_error_pct,
        "delta_p_rms_pct": result.delta_p_rms_pct,
        "ppl_change_pct": result.ppl_change_pct,
        "ppl_change_error_pct": result.ppl_change_error_pct,
        "chunks_scored": result.chunks_scored,
        "tokens_scored": result.tokens_scored,
        "beyond_floor": (
            beyond_uncertainty(result, floor, SIGMAS) if floor is not None and not result.is_floor else None
        ),
        "next_quant": following[0] if following else None,
        "beyond_next": beyond_uncertainty(result, following[1], SIGMAS) if following else None,
        "standard_errors_from_next": standard_errors_apart(result, following[1]) if following else None,
    }


def quality_loss(kld: KldSet | None, quants: Sequence[str], why_missing: str) -> QualityLoss:
    """Rows and sentences of every quantization's loss (f16 KV cache), in the run's order."""
    if kld is None:
        return QualityLoss(pd.DataFrame(columns=list(QUALITY_LOSS_COLUMNS)), (), None, None, why_missing)
    floor = kld.floor()
    weights = kld.for_cache_type(FLOOR_CACHE_TYPE)
    compared = [q for q in _ordered(weights, quants) if not weights[q].is_floor]
    sentences: list[str] = [_floor_sentence(floor)] if floor is not None else []
    rows: list[dict[str, Any]] = [_row(floor.quant, floor, None, None)] if floor is not None else []
    for index, label in enumerate(compared):
        following = (compared[index + 1], weights[compared[index + 1]]) if index + 1 < len(compared) else None
        sentences.append(_sentence(label, weights[label], floor, following))
        rows.append(_row(label, weights[label], floor, following))
    for label in _ordered(kld.results, quants):  # the other KV-cache types, for the table and CSV
        for cache_type, result in kld.results[label].items():
            if cache_type != FLOOR_CACHE_TYPE:
                rows.append(_row(label, result, floor, None))
    missing = None if compared or floor else "quality.json holds a KLD base but no comparison"
    return QualityLoss(
        pd.DataFrame(rows, columns=list(QUALITY_LOSS_COLUMNS)),
        tuple(sentences),
        reference_text(kld.base),
        floor.kld_mean_nats if floor is not None else None,
        missing,
    )
