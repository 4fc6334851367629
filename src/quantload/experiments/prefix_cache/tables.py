"""The prompt-cache experiment's table: per quantization, TTFT with cache_prompt off against on.

Every request carries the same long system prompt; "off" sends cache_prompt=false (the whole prompt
is computed every time), "on" sends cache_prompt=true after warm-up requests put the prefix in the
slots. `cache_n` (the server's count of prompt tokens it reused) shows whether the cache really
served the prefix.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from quantload.analysis.stage_tables import level_table
from quantload.experiments.prefix_cache.stages import NAME


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
    levels = level_table(stages, NAME, "cache_prompt", quant_order)
    if levels.empty:
        return []
    chosen = stages[stages["experiment"] == NAME]
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
