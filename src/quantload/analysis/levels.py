"""Load figures per level (users, rate or cache state): the median of the repeats and their range.

Only complete stages count (status "ok", or "unrecorded" when stages.jsonl is absent); failed,
aborted and unfinished ones are named in the row's `excluded`, so the reader sees what a figure
leaves out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from quantload.analysis.stages import USABLE
from quantload.analysis.stats import spread

LEVEL_METRICS: tuple[str, ...] = (
    "ttft_p50_s",
    "ttft_p99_s",
    "ttft_from_intended_p50_s",
    "ttft_from_intended_p99_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "e2e_p50_s",
    "e2e_mean_s",
    "output_tok_s",
    "requests_per_s",
    "goodput_rps",
    "failed_frac",
    "good_frac",
    "cache_n_mean",
    "lag_p99_s",
)


def _excluded(group: pd.DataFrame) -> list[str]:
    bad = group[~group["status"].isin(USABLE)]
    return [
        f"repeat {row.repeat}: {row.status} ({row.reason or 'no reason given'})" for row in bad.itertuples()
    ]


def level_table(stages: pd.DataFrame, experiment: str, key: str, quant_order: Sequence[str]) -> pd.DataFrame:
    """One row per (quant, `key`) of `experiment`: each metric's median, _min and _max over repeats."""
    if stages.empty:
        return pd.DataFrame()
    chosen = stages[stages["experiment"] == experiment]
    rows: list[dict[str, Any]] = []
    for (quant, level), group in chosen.groupby(["quant", key], sort=False, dropna=True):
        used = group[group["status"].isin(USABLE)]
        row: dict[str, Any] = {
            "quant": quant,
            key: level,
            "repeats_used": len(used),
            "repeats_seen": len(group),
            "requests": int(used["requests"].sum()),
            "excluded": _excluded(group),
        }
        for metric in LEVEL_METRICS:
            found = spread(used[metric]) if metric in used else None
            row[metric] = found.median if found else None
            row[f"{metric}_min"] = found.low if found else None
            row[f"{metric}_max"] = found.high if found else None
        rows.append(row)
    return sort_by_quant(pd.DataFrame(rows), quant_order, key)


def sort_by_quant(table: pd.DataFrame, quant_order: Sequence[str], key: str) -> pd.DataFrame:
    """Rows in the run's quantization order, then by `key`."""
    if table.empty:
        return table
    rank = {quant: index for index, quant in enumerate(quant_order)}
    table = table.assign(_rank=table["quant"].map(lambda q: rank.get(q, len(rank))))
    return table.sort_values(["_rank", key], kind="stable").drop(columns="_rank").reset_index(drop=True)
