"""The KL-divergence part of `quality.json`: every file's token distributions against the F16's.

Stored under the key `kld` of `quality.json` (see `quantload.quality.results`)::

    "kld": {
      "base":    KldBase,                       # the F16 run every file is compared with
      "results": {"F16":  {"f16": KldResult,    # the floor: F16 against its own base
                           "q8_0": KldResult},  # F16 weights, q8_0 KV cache
                  "Q8_0": {"f16": KldResult, "q8_0": KldResult}, ...}
    }

Results are keyed by the file's label (its quantization) and then by the KV-cache type used for
both K and V. Units are in the names: KLD in nats (natural log, as llama-perplexity computes it),
shares and probability changes in percent. An uncertainty is one standard error as
llama-perplexity printed it; it is None where the tool printed nan (e.g. a floor of zeros).
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from quantload.quality.dataset import DatasetInfo

FLOOR_CACHE_TYPE = "f16"


def finite_or_none(value: float) -> float | None:
    """`value`, or None for nan/inf (which JSON cannot hold)."""
    return value if math.isfinite(value) else None


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KldBase(_Frozen):
    """The reference run: the F16 file's log-probabilities, saved for every scored token."""

    quant: str = Field(description="the reference file's quantization (F16)")
    model_path: str
    model_name: str
    model_size_bytes: int
    model_sha256: str
    source_note: str | None = Field(
        description="where the reference came from (e.g. SmolLM2's F16 rebuilt from Q4_1): every"
        " KLD measures loss relative to this file"
    )
    dataset: DatasetInfo
    ctx_tokens: int
    chunks_requested: int = Field(description="quality.kld_chunks; 0 = every chunk of the text")
    chunks_scored: int
    tokens_scored: int
    n_vocab: int
    cache_type: str = Field(default=FLOOR_CACHE_TYPE, description="KV cache type of the base run")
    predicted_size_bytes: int = Field(description="computed before writing (an upper bound for all chunks)")
    file_size_bytes: int = Field(description="the base logits file as written")
    file_path: str = Field(description="where it was (or is, when kept) in the cache")
    kept: bool = Field(description="left in the cache after use (quality.kld_keep_base)")
    reused: bool = Field(description="taken from an earlier kept file instead of being measured")
    perplexity: float = Field(description="the reference's own perplexity on these chunks")
    perplexity_error: float
    wall_time_s: float = Field(description="the base run's wall time (0 when reused)")
    other_cpu_frac: float | None = Field(description="other processes' share of the CPUs meanwhile")
    command: list[str]
    llama_cpp: dict[str, Any]
    measured_at: str


class KldResult(_Frozen):
    """One file, run with one KV-cache type, against the base: how far its predictions moved."""

    quant: str
    model_path: str
    model_size_bytes: int
    cache_type_k: str
    cache_type_v: str
    flash_attn: Literal["auto", "on"] = Field(
        description="-fa as passed: 'on' where a quantized V cache needs it, else llama.cpp's auto"
    )
    is_floor: bool = Field(description="the base's own file and cache type: the noise floor")
    chunks_scored: int
    tokens_scored: int
    kld_mean_nats: float
    kld_mean_error_nats: float | None = Field(
        description="llama-perplexity's standard error, which treats every token as independent"
    )
    kld_mean_chunk_error_nats: float | None = Field(
        default=None,
        description="standard error from the spread of the chunks' own means (tokens of one chunk"
        " move together, so this is the more honest one; recovered from the 5-decimal running"
        " means, whose rounding can only inflate it); None below 3 chunks",
    )
    kld_median_nats: float
    kld_p99_nats: float
    kld_p99_9_nats: float
    kld_max_nats: float
    kld_quantiles_nats: dict[str, float] = Field(description="p0_1 ... p99_9, min, median, max")
    same_top_p_pct: float = Field(description="tokens whose most likely next token matches the base's")
    same_top_p_error_pct: float | None
    delta_p_rms_pct: float = Field(description="RMS change of the probability of the actual next token")
    delta_p_rms_error_pct: float | None
    delta_p_mean_pct: float
    delta_p_mean_error_pct: float | None
    delta_p_quantiles_pct: dict[str, float]
    ppl_change_pct: float = Field(
        description="100 x (PPL(Q) / the reference's own perplexity - 1), on the same tokens"
    )
    ppl_change_error_pct: float | None = Field(description="paired: from ln_ppl_ratio_error")
    ln_ppl_ratio: float = Field(
        description="llama-perplexity's ln(PPL(Q)/PPL(base)), paired per token; PPL(base) comes from"
        " the stored 16-bit log-probabilities, clipped 16 nats below the top token, which read"
        " low: the floor's value is that offset"
    )
    ln_ppl_ratio_error: float | None
    ppl_ratio: float
    ppl_ratio_error: float | None
    ppl_q: float
    ppl_q_error: float | None
    ppl_base: float
    ppl_base_error: float | None
    ppl_diff: float
    ppl_diff_error: float | None
    ln_ppl_correlation_pct: float | None
    running_kld_mean_nats: list[float] = Field(description="the mean KLD after each chunk")
    wall_time_s: float
    other_cpu_frac: float | None
    command: list[str]
    llama_cpp: dict[str, Any]
    measured_at: str


def _error(result: KldResult) -> float:
    return max(result.kld_mean_error_nats or 0.0, result.kld_mean_chunk_error_nats or 0.0)


def mean_error_nats(result: KldResult) -> float | None:
    """The mean KLD's standard error `beyond_uncertainty` uses: the larger of the per-token and the
    per-chunk one; None when llama-perplexity printed neither."""
    known = [e for e in (result.kld_mean_error_nats, result.kld_mean_chunk_error_nats) if e is not None]
    return max(known) if known else None


def standard_errors_apart(a: KldResult, b: KldResult) -> float | None:
    """How many combined standard errors (`mean_error_nats`, as if independent) the two mean KLDs
    differ by; None when neither has an error (inf when only that is zero)."""
    combined = math.hypot(_error(a), _error(b))
    difference = abs(a.kld_mean_nats - b.kld_mean_nats)
    if combined == 0.0:
        return None if difference == 0.0 else math.inf
    return difference / combined


def chunk_standard_error(running_means: list[float]) -> float | None:
    """The standard error of the mean from the chunks' own means, recovered from running means
    (every chunk scores the same number of tokens); None below 3 chunks."""
    if len(running_means) < 3:
        return None
    chunk_means = [
        index * running - (index - 1) * previous
        for index, (running, previous) in enumerate(
            zip(running_means, [0.0, *running_means[:-1]], strict=True), start=1
        )
    ]
    return statistics.stdev(chunk_means) / math.sqrt(len(chunk_means))


def beyond_uncertainty(a: KldResult, b: KldResult, sigmas: float = 2.0) -> bool:
    """True when the two mean KLDs differ by more than `sigmas` combined standard errors.

    Each mean's error is the larger of the per-token and the per-chunk one, and the two are
    combined as if independent; the two runs score the same tokens, so the real uncertainty of the
    difference is smaller and this test is conservative.
    """
    combined = math.hypot(_error(a), _error(b))
    return abs(a.kld_mean_nats - b.kld_mean_nats) > sigmas * combined


class KldSet(_Frozen):
    """The base and every comparison made against it."""

    base: KldBase
    results: dict[str, dict[str, KldResult]] = Field(
        default_factory=dict, description="{file label: {KV cache type: result}}"
    )

    def with_result(self, label: str, cache_type: str, result: KldResult) -> KldSet:
        """A copy with `result` stored (or replaced) under `label` and `cache_type`."""
        per_label = {**self.results.get(label, {}), cache_type: result}
        return self.model_copy(update={"results": {**self.results, label: per_label}})

    def floor(self) -> KldResult | None:
        """The reference file against its own base (what every other KLD is judged against)."""
        for per_label in self.results.values():
            for result in per_label.values():
                if result.is_floor:
                    return result
        return None

    def for_cache_type(self, cache_type: str = FLOOR_CACHE_TYPE) -> dict[str, KldResult]:
        """{file label: result} for one KV cache type (f16: the weights' own quality loss)."""
        return {
            label: per_label[cache_type]
            for label, per_label in self.results.items()
            if cache_type in per_label
        }

    def same_base(self, other: KldBase) -> bool:
        """True when `other` describes the same reference run (same file, text and settings)."""
        fields = ("model_sha256", "ctx_tokens", "chunks_scored", "n_vocab")
        return all(getattr(self.base, name) == getattr(other, name) for name in fields) and (
            self.base.dataset.sha256 == other.dataset.sha256
        )
