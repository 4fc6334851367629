"""Where TTFT goes, from the records and the stage table.

The split: llama-server's `timings.prompt_ms` runs from the moment a slot takes the request to the
end of the prompt; the client's TTFT runs from sending to the first generated text. The difference
is the time spent waiting for a slot, on the wire and in the server's HTTP layer.

The prompt-cache experiment: every request carries the same long system prompt; "off" sends
cache_prompt=false (the whole prompt is computed every time), "on" sends cache_prompt=true after
warm-up requests put the prefix in the slots. `cache_n` (the server's count of prompt tokens it
reused) shows whether the cache really served the prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from quantload.analysis.stage_tables import USABLE, level_table, sort_by_quant
from quantload.stats import percentile


def ttft_split_table(
    records: pd.DataFrame, stages: pd.DataFrame, experiment: str, quant_order: Sequence[str]
) -> pd.DataFrame:
    """Per (quant, users): TTFT, prefill and queueing+network p50/p99, pooled over complete repeats."""
    if stages.empty or records.empty:
        return pd.DataFrame()
    complete = stages[(stages["experiment"] == experiment) & stages["status"].isin(USABLE)]
    ids = set(complete["stage_id"].astype(str))
    chosen = records[records["stage_id"].isin(ids) & records["ok"] & ~records["warmup"]]
    chosen = chosen.dropna(subset=["ttft_s", "prompt_ms"])
    rows: list[dict[str, Any]] = []
    for (quant, users), group in chosen.groupby(["quant", "stage_users"], sort=False):
        prefill = group["prompt_ms"] / 1000.0
        queue = group["ttft_s"] - prefill
        ttft_p50 = percentile(group["ttft_s"], 50)
        queue_p50 = percentile(queue, 50)
        rows.append(
            {
                "quant": quant,
                "users": int(users),
                "requests": len(group),
                "ttft_p50_s": ttft_p50,
                "ttft_p99_s": percentile(group["ttft_s"], 99),
                "prefill_p50_s": percentile(prefill, 50),
                "prefill_p99_s": percentile(prefill, 99),
                "queue_network_p50_s": queue_p50,
                "queue_network_p99_s": percentile(queue, 99),
                "queue_share_p50": queue_p50 / ttft_p50 if queue_p50 is not None and ttft_p50 else None,
                "negative_queue": int((queue < 0).sum()),
            }
        )
    return sort_by_quant(pd.DataFrame(rows), quant_order, "users")


@dataclass(frozen=True)
class CacheState:
    """TTFT of one cache state: medians of the repeats and their range."""

    ttft_p50_s: float | None
    ttft_p50_range_s: tuple[float | None, float | None]
    ttft_p99_s: float | None
    ttft_p99_range_s: tuple[float | None, float | None]
    cache_n_mean: float | None
    requests: int
    repeats: int


@dataclass(frozen=True)
class CacheComparison:
    """One quantization's prompt-cache result."""

    quant: str
    prefix_tokens: int | None
    off: CacheState | None
    on: CacheState | None
    speedup_p50: float | None
    speedup_p99: float | None
    excluded: tuple[str, ...]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _state(row: dict[str, Any] | None) -> CacheState | None:
    if row is None or row.get("ttft_p50_s") is None or pd.isna(row.get("ttft_p50_s")):
        return None

    def get(name: str) -> float | None:
        value = row.get(name)
        return None if value is None or pd.isna(value) else float(value)

    return CacheState(
        ttft_p50_s=get("ttft_p50_s"),
        ttft_p50_range_s=(get("ttft_p50_s_min"), get("ttft_p50_s_max")),
        ttft_p99_s=get("ttft_p99_s"),
        ttft_p99_range_s=(get("ttft_p99_s_min"), get("ttft_p99_s_max")),
        cache_n_mean=get("cache_n_mean"),
        requests=int(row.get("requests") or 0),
        repeats=int(row.get("repeats_used") or 0),
    )


def _ratio(off: float | None, on: float | None) -> float | None:
    return off / on if off is not None and on else None


def prompt_cache_table(stages: pd.DataFrame, quant_order: Sequence[str]) -> list[CacheComparison]:
    """One comparison per quantization that ran the experiment."""
    levels = level_table(stages, "prefix_cache", "cache_prompt", quant_order)
    if levels.empty:
        return []
    chosen = stages[stages["experiment"] == "prefix_cache"]
    out = []
    for quant in dict.fromkeys(levels["quant"]):
        rows = {bool(r["cache_prompt"]): r for r in levels[levels["quant"] == quant].to_dict("records")}
        off, on = _state(rows.get(False)), _state(rows.get(True))
        prefix = chosen[chosen["quant"] == quant]["prefix_tokens"].dropna()
        excluded = [text for r in rows.values() for text in r.get("excluded", [])]
        out.append(
            CacheComparison(
                quant=str(quant),
                prefix_tokens=int(prefix.iloc[0]) if len(prefix) else None,
                off=off,
                on=on,
                speedup_p50=_ratio(off.ttft_p50_s if off else None, on.ttft_p50_s if on else None),
                speedup_p99=_ratio(off.ttft_p99_s if off else None, on.ttft_p99_s if on else None),
                excluded=tuple(excluded),
            )
        )
    return out


def reasoning_table(records: pd.DataFrame, quant_order: Sequence[str]) -> pd.DataFrame:
    """Per (quant, experiment) with reasoning chunks: TTFT (first token of any kind, reasoning
    included) beside the time to the first answer content, and how many requests got none."""
    if records.empty or "reasoning_chunks" not in records:
        return pd.DataFrame()
    measured = records[~records["warmup"] & records["ok"]]
    thinking = measured[measured["reasoning_chunks"].fillna(0) > 0]
    if thinking.empty:
        return pd.DataFrame()
    rows: list[dict[str, Any]] = []
    for (quant, experiment), group in thinking.groupby(["quant", "experiment"], sort=False):
        rows.append(
            {
                "quant": quant,
                "experiment": experiment,
                "requests": len(group),
                "reasoning_chunks_mean": float(group["reasoning_chunks"].mean()),
                "ttft_p50_s": percentile(group["ttft_s"], 50),
                "ttft_p99_s": percentile(group["ttft_s"], 99),
                "ttft_content_p50_s": percentile(group["ttft_content_s"], 50),
                "ttft_content_p99_s": percentile(group["ttft_content_s"], 99),
                "no_content": int(group["ttft_content_s"].isna().sum()),
            }
        )
    return sort_by_quant(pd.DataFrame(rows), quant_order, "experiment")
