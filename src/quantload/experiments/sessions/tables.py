"""The sessions experiment's tables from the records: TTFT and prompt tokens by turn, the
prefix-cache hit rate of each conversation, and which slot placement kept a conversation's cache.

Only the measured records of complete sessions-experiment stages count (the stage table says which
stages those are). A conversation's hit rate is the share of the prompt tokens of its later turns
(turn 1 on) that llama-server found in its cache (`timings.cache_n`): turn 0 has no history of its
own to find, and a later turn can at most reuse everything but its new user text.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from quantload.analysis.stage_tables import USABLE, sort_by_quant
from quantload.analysis.stats import mean
from quantload.experiments.sessions.stages import NAME
from quantload.stats import percentile

SESSION_EXPERIMENTS = (NAME,)


def session_records(records: pd.DataFrame, stages: pd.DataFrame) -> pd.DataFrame:
    """The measured records of complete sessions stages that carry a session id and turn."""
    if records.empty or stages.empty:
        return records.iloc[0:0]
    usable = stages[stages["experiment"].isin(SESSION_EXPERIMENTS) & stages["status"].isin(USABLE)]
    chosen = records[
        records["stage_id"].isin(usable["stage_id"])
        & ~records["warmup"]
        & records["session_id"].notna()
        & records["turn"].notna()
    ]
    return chosen


def turn_table(records: pd.DataFrame, stages: pd.DataFrame, quant_order: Sequence[str]) -> pd.DataFrame:
    """One row per (quant, cache_prompt, turn): requests, TTFT p50/p99, prompt and cached tokens."""
    chosen = session_records(records, stages)
    if chosen.empty:
        return pd.DataFrame()
    rows: list[dict[str, Any]] = []
    for (quant, cache_on, turn), group in chosen.groupby(["quant", "cache_prompt", "turn"], sort=False):
        ok = group[group["ok"]]
        prompt, cached = ok["prompt_tokens"], ok["cache_n"]
        total = float(prompt.sum()) if len(prompt) else 0.0
        rows.append(
            {
                "quant": quant,
                "cache_prompt": bool(cache_on),
                "turn": int(turn),
                "requests": len(group),
                "ok": len(ok),
                "ttft_p50_s": percentile(ok["ttft_s"], 50),
                "ttft_p99_s": percentile(ok["ttft_s"], 99),
                "prompt_tokens_p50": percentile(prompt, 50),
                "cached_tokens_mean": mean(cached),
                "cache_hit_frac": float(cached.sum()) / total if total > 0 else None,
                "prefill_p50_s": percentile(ok["prompt_ms"] / 1000.0, 50),
            }
        )
    table = pd.DataFrame(rows).sort_values(["cache_prompt", "turn"], kind="stable")
    return sort_by_quant(table, quant_order, "turn")


def session_hits(records: pd.DataFrame, stages: pd.DataFrame, quant_order: Sequence[str]) -> pd.DataFrame:
    """One row per conversation: its turns, later-turn prompt and cached tokens, its hit rate."""
    chosen = session_records(records, stages)
    if chosen.empty:
        return pd.DataFrame()
    rows: list[dict[str, Any]] = []
    for (quant, cache_on, session), group in chosen.groupby(
        ["quant", "cache_prompt", "session_id"], sort=False
    ):
        later = group[group["ok"] & group["turn"].ge(1)]
        prompt = float(later["prompt_tokens"].sum())
        cached = float(later["cache_n"].fillna(0.0).sum())
        rows.append(
            {
                "quant": quant,
                "cache_prompt": bool(cache_on),
                "session_id": session,
                "turns": len(group),
                "turns_ok": int(group["ok"].sum()),
                "id_slot": group["id_slot"].dropna().iloc[0] if group["id_slot"].notna().any() else None,
                "later_prompt_tokens": prompt,
                "later_cached_tokens": cached,
                "hit_frac": cached / prompt if prompt > 0 else None,
            }
        )
    return sort_by_quant(pd.DataFrame(rows), quant_order, "cache_prompt")


def hit_summary(hits: pd.DataFrame) -> pd.DataFrame:
    """Per (quant, cache_prompt): conversations, their hit rate's median, min and max, and how many
    found (almost) nothing of their own history (hit rate below 10 %)."""
    if hits.empty:
        return pd.DataFrame()
    rows = []
    for (quant, cache_on), group in hits.groupby(["quant", "cache_prompt"], sort=False):
        rates = group["hit_frac"].dropna()
        rows.append(
            {
                "quant": quant,
                "cache_prompt": bool(cache_on),
                "sessions": len(group),
                "pinned": bool(group["id_slot"].notna().any()),
                "hit_frac_p50": percentile(rates, 50),
                "hit_frac_min": float(rates.min()) if len(rates) else None,
                "hit_frac_max": float(rates.max()) if len(rates) else None,
                "lost_cache": int(rates.lt(0.1).sum()),
            }
        )
    return pd.DataFrame(rows)
