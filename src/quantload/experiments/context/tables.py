"""The context experiment's tables, from the records: per policy, where conversations were refused, trimmed or
shifted, TTFT and prompt tokens by turn, the cache hit rate before and after, and how many
conversations completed.

Only the measured records of complete context stages count (the stage table says which those are,
and each stage's policy). A conversation's *event* is where its history first met the slot: the
first refused turn (fail and shift: `context_exceeded`), the first trimmed turn (trim: a history
that left turns out) or the first shifted reply (shift). Its hit rate is the share of the prompt
tokens of its later turns (turn 1 on) the server found in its cache (`timings.cache_n`), before
the event and from it on: a trim sends a history whose beginning (after the system prompt) the
server has not seen, and a shift rewrites the slot, so what the cache still holds shows there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from quantload.analysis.stage_tables import USABLE
from quantload.experiments.context.stages import NAME
from quantload.stats import percentile

POLICY_ORDER = ("fail", "trim", "shift")
EVENT_WORDS = {"fail": "refused", "trim": "trimmed", "shift": "shifted"}


def context_records(records: pd.DataFrame, stages: pd.DataFrame) -> pd.DataFrame:
    """The measured records of complete context stages, with each one's `policy`."""
    if records.empty or stages.empty or "context_policy" not in stages:
        return records.iloc[0:0].assign(policy=pd.Series(dtype=object))
    usable = stages[(stages["experiment"] == NAME) & stages["status"].isin(USABLE)]
    policy_of = dict(zip(usable["stage_id"], usable["context_policy"], strict=True))
    chosen = records[
        records["stage_id"].isin(list(policy_of)) & ~records["warmup"] & records["session_id"].notna()
    ]
    return chosen.assign(policy=chosen["stage_id"].map(policy_of))


def _flag(frame: pd.DataFrame, column: str) -> pd.Series:
    return frame[column].eq(True) if column in frame else pd.Series(False, index=frame.index)


def _trimmed(frame: pd.DataFrame) -> pd.Series:
    return pd.to_numeric(frame["trimmed_turns"], errors="coerce").fillna(0).gt(0)


def _hit_frac(frame: pd.DataFrame) -> float | None:
    ok = frame[frame["ok"]]
    prompt = float(ok["prompt_tokens"].sum())
    return float(ok["cache_n"].fillna(0.0).sum()) / prompt if prompt > 0 else None


def turn_table(records: pd.DataFrame, stages: pd.DataFrame, quant_order: Sequence[str]) -> pd.DataFrame:
    """One row per (quant, policy, turn): requests sent, ok, refused, truncated, shifted, trimmed,
    TTFT p50/p99, prompt tokens p50, the cache hit rate."""
    chosen = context_records(records, stages)
    sent = chosen[chosen["error_class"].ne("session_cut")]
    if sent.empty:
        return pd.DataFrame()
    rows: list[dict[str, Any]] = []
    for (quant, policy, turn), group in sent.groupby(["quant", "policy", "turn"], sort=False):
        ok = group[group["ok"]]
        rows.append(
            {
                "quant": quant,
                "policy": policy,
                "turn": int(turn),
                "requests": len(group),
                "ok": len(ok),
                "refused": int(group["error_class"].eq("context_exceeded").sum()),
                "truncated": int(_flag(ok, "truncated").sum()),
                "shifted": int(_flag(ok, "context_shifted").sum()),
                "trimmed": int(_trimmed(ok).sum()),
                "ttft_p50_s": percentile(ok["ttft_s"], 50),
                "ttft_p99_s": percentile(ok["ttft_s"], 99),
                "prompt_tokens_p50": percentile(ok["prompt_tokens"], 50),
                "cache_hit_frac": _hit_frac(group) if int(turn) > 0 else None,
            }
        )
    return _sorted(pd.DataFrame(rows), quant_order, "turn")


def _sorted(table: pd.DataFrame, quant_order: Sequence[str], *then: str) -> pd.DataFrame:
    """Rows in the run's quantization order, then policy order (fail, trim, shift), then `then`."""
    rank = {quant: index for index, quant in enumerate(quant_order)}
    table = table.assign(
        _quant=table["quant"].map(lambda q: rank.get(q, len(rank))),
        _policy=table["policy"].map(
            lambda p: POLICY_ORDER.index(p) if p in POLICY_ORDER else len(POLICY_ORDER)
        ),
    )
    ordered = table.sort_values(["_quant", "_policy", *then], kind="stable")
    return ordered.drop(columns=["_quant", "_policy"]).reset_index(drop=True)


def _event_turn(group: pd.DataFrame, policy: str) -> int | None:
    if policy == "trim":
        hit = group[group["ok"] & _trimmed(group)]
    elif policy == "shift":
        hit = group[group["ok"] & _flag(group, "context_shifted")]
    else:
        hit = group[group["error_class"].eq("context_exceeded")]
    return int(hit["turn"].min()) if not hit.empty else None


def conversation_table(records: pd.DataFrame, stages: pd.DataFrame) -> pd.DataFrame:
    """One row per conversation: its policy, turns, whether it completed, its event turn, the first
    refused and truncated turns, what a refusal said (the prompt's tokens and the slot's), and its
    hit rate before and from the event."""
    chosen = context_records(records, stages)
    if chosen.empty:
        return pd.DataFrame()
    rows: list[dict[str, Any]] = []
    for (quant, policy, session), group in chosen.groupby(["quant", "policy", "session_id"], sort=False):
        group = group.sort_values("turn")
        event = _event_turn(group, str(policy))
        refused = group[group["error_class"].eq("context_exceeded")]
        truncated = group[group["ok"] & _flag(group, "truncated")]
        later = group[group["turn"].ge(1)]
        before = later[later["turn"].lt(event)] if event is not None else later
        after = later[later["turn"].ge(event)] if event is not None else later.iloc[0:0]
        if policy == "shift" and event is not None:
            after = later[later["turn"].gt(event)]  # the shifted reply's own prompt was whole
        first_refusal = refused.iloc[0] if not refused.empty else None
        rows.append(
            {
                "quant": quant,
                "policy": policy,
                "session_id": session,
                "turns": len(group),
                "turns_ok": int(group["ok"].sum()),
                "completed": bool(group["ok"].all()),
                "event_turn": event,
                "refused_turn": int(refused["turn"].min()) if not refused.empty else None,
                "truncated_turn": int(truncated["turn"].min()) if not truncated.empty else None,
                "refused_prompt_tokens": first_refusal["n_prompt_tokens"]
                if first_refusal is not None
                else None,
                "refused_n_ctx": first_refusal["n_ctx"] if first_refusal is not None else None,
                "trimmed_turns_max": float(pd.to_numeric(group["trimmed_turns"], errors="coerce").max()),
                "hit_frac_before": _hit_frac(before),
                "hit_frac_after": _hit_frac(after),
                "after_turns_ok": int(after["ok"].sum()),
            }
        )
    return pd.DataFrame(rows)


def policy_table(conversations: pd.DataFrame, quant_order: Sequence[str]) -> pd.DataFrame:
    """Per (quant, policy): conversations, how many completed, the event turn (median, first,
    last) and how many had one, the first refusal's counts, and the hit rate before and after
    (the median over conversations)."""
    if conversations.empty:
        return pd.DataFrame()
    rows = []
    for (quant, policy), group in conversations.groupby(["quant", "policy"], sort=False):
        events = group["event_turn"].dropna()
        refusal = group[group["refused_prompt_tokens"].notna()]
        rows.append(
            {
                "quant": quant,
                "policy": policy,
                "conversations": len(group),
                "completed": int(group["completed"].sum()),
                "with_event": len(events),
                "event_turn_p50": percentile(events, 50),
                "event_turn_min": float(events.min()) if len(events) else None,
                "event_turn_max": float(events.max()) if len(events) else None,
                "refused_turn_p50": percentile(group["refused_turn"].dropna(), 50),
                "truncated_replies": int(group["truncated_turn"].notna().sum()),
                "refused_prompt_tokens": refusal["refused_prompt_tokens"].iloc[0]
                if not refusal.empty
                else None,
                "refused_n_ctx": refusal["refused_n_ctx"].iloc[0] if not refusal.empty else None,
                "hit_frac_before": percentile(group["hit_frac_before"].dropna(), 50),
                "hit_frac_after": percentile(group["hit_frac_after"].dropna(), 50),
                "after_conversations": int(group["hit_frac_after"].notna().sum()),
            }
        )
    return _sorted(pd.DataFrame(rows), quant_order)
