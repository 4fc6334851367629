"""Slots at a fixed KV budget, from the slots experiment's limit searches, variants and records.

Per quantization and slot count (`-np`): the context each slot held, the KV cache predicted
(quantload.kvcache) and as that variant's server logged it (variants.jsonl), the memory its log
reports, what the limit search found (users, confirmed, how it ended) and the goodput at that
limit (the median over the trials that held at it), and which requests no longer fit a slot:

  refused     requests the server refused for their size (HTTP 400 "exceeds the available
              context size")
  cut         requests that stopped at the slot's end ("length" before their max_tokens)
  need_over   the share of the workload's requests (every slots trial of this quantization)
              needing more tokens than a slot holds: prompt tokens (the server's count, or the
              count its refusal named) plus the max_tokens asked

The verdict names the fewest slots whose limit is within `PAYING_FRAC` of the most any count
held (where more slots stop paying) and the counts at which requests no longer fit.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.experiments.variant_file import VariantLine
from quantload.load.limit_file import LimitLine
from quantload.load.summary import StageSummary

PREFIX = "slots -np "
PAYING_FRAC = 0.9  # more slots "pay" while they raise the limit by more than 10 %
_REFUSED = re.compile(r"request \((\d+) tokens\) exceeds the available context size")


def _slots_of(label: str | None) -> tuple[int, int] | None:
    """(slots, total cells) of a variant label "slots -np N -c C"."""
    if not label or not label.startswith(PREFIX):
        return None
    parts = label[len(PREFIX) :].split()
    try:
        return int(parts[0]), int(parts[2])
    except (IndexError, ValueError):
        return None


def goodput_at_limit(line: LimitLine, summaries: dict[str, StageSummary]) -> float | None:
    """The median goodput (requests/s) of the trials that met the SLO at the limit the search found."""
    if line.limit is None:
        return None
    held = [
        summaries[t.stage_id].goodput_rps
        for t in line.trials
        if t.met and t.level == line.limit and t.stage_id in summaries
    ]
    found = [value for value in held if value is not None]
    return statistics.median(found) if found else None


def needed_tokens(row: dict[str, Any]) -> float | None:
    """The tokens one request needs in its slot: its prompt and the output it asked for."""
    prompt = fmt.cell_float(row.get("prompt_tokens"))
    if prompt is None:
        match = _REFUSED.search(str(row.get("error") or ""))
        prompt = float(match[1]) if match else None
    asked = fmt.cell_float(row.get("max_tokens")) or 0.0
    return prompt + asked if prompt is not None else None


def slots_table(
    limits: Sequence[LimitLine],
    variants: Sequence[VariantLine],
    summaries: dict[str, StageSummary],
    records: pd.DataFrame,
    quant_order: Sequence[str],
) -> pd.DataFrame:
    """One row per (quant, slot count) the slots experiment searched (see the module docstring)."""
    lines = [line for line in limits if _slots_of(line.variant) is not None]
    if not lines:
        return pd.DataFrame()
    rows: list[dict[str, Any]] = []
    for line in lines:
        slots, cells = _slots_of(line.variant) or (0, 0)
        stage_ids = {t.stage_id for t in line.trials if t.stage_id}
        mine = (
            records[records["stage_id"].isin(stage_ids) & ~records["warmup"]]
            if not records.empty
            else records
        )
        variant = next((v for v in variants if v.label == line.variant and v.quant == line.quant), None)
        kv = variant.kv if variant is not None and variant.kv else {}
        refused = (
            mine["error"].astype(str).str.contains("exceeds the available context size") if len(mine) else []
        )
        cut = (
            mine["ok"] & mine["finish_reason"].eq("length") & (mine["completion_tokens"] < mine["max_tokens"])
            if len(mine)
            else []
        )
        rows.append(
            {
                "quant": line.quant,
                "slots": slots,
                "ctx_per_slot": cells // slots if slots else None,
                "kv_predicted_mib": kv.get("predicted_mib"),
                "kv_reported_mib": kv.get("reported_mib"),
                "memory_mib": variant.memory_mib if variant is not None else None,
                "limit_users": line.limit,
                "undecided": ", ".join(f"{x:g}" for x in line.undecided),
                "misses_from": line.lowest_miss,
                "ending": line.ending,
                "sentence": line.sentence,
                "goodput_rps": goodput_at_limit(line, summaries),
                "requests": len(mine),
                "refused": int(sum(refused)),
                "cut": int(sum(cut)),
                "_needs": [n for n in (needed_tokens(r) for r in mine.to_dict("records")) if n is not None],
            }
        )
    table = pd.DataFrame(rows)
    table["need_over_frac"] = None
    for _, group in table.groupby("quant", sort=False):
        needs = [n for pool in group["_needs"] for n in pool]
        for index in group.index:
            ctx = table.at[index, "ctx_per_slot"]
            over = sum(1 for n in needs if ctx is not None and n > ctx)
            table.at[index, "need_over_frac"] = over / len(needs) if needs else None
    rank = {quant: index for index, quant in enumerate(quant_order)}
    table = table.assign(_rank=table["quant"].map(lambda q: rank.get(q, len(rank))))
    table = table.sort_values(["_rank", "slots"], kind="stable").drop(columns=["_rank", "_needs"])
    return table.reset_index(drop=True)


def slots_verdict(table: pd.DataFrame) -> str:
    """One sentence per quantization: where more slots stop paying, and what no longer fits."""
    if table.empty:
        return "not measured: no limit search of the slots experiment"
    sentences = []
    for quant, group in table.groupby("quant", sort=False):
        held = group[group["limit_users"].notna()]
        if held.empty:
            sentences.append(f"{quant}: no slot count was shown to meet the SLO")
            continue
        best = float(held["limit_users"].max())
        enough = held[held["limit_users"] >= PAYING_FRAC * best].iloc[0]
        most = held[held["limit_users"] == best].iloc[0]
        said = (
            f"{quant}: -np {int(enough['slots'])} ({int(enough['ctx_per_slot']):,} tokens a slot) holds"
            f" {int(enough['limit_users'])} users"
        )
        if int(most["slots"]) != int(enough["slots"]):
            said += (
                f", within {1 - PAYING_FRAC:.0%} of the most any count held ({int(best)} at"
                f" -np {int(most['slots'])})"
            )
        said += "; more slots stop paying there"
        unfit = group[(group["refused"] > 0) | (group["cut"] > 0)]
        if not unfit.empty:
            first = unfit.iloc[0]
            said += (
                f"; from -np {int(first['slots'])} ({int(first['ctx_per_slot']):,} tokens a slot) requests no"
                f" longer fit: {int(first['refused'])} refused and {int(first['cut'])} cut short of"
                f" {int(first['requests'])}, {fmt.percent(fmt.cell_float(first['need_over_frac']), 0)} of"
                " this workload needs more"
            )
        sentences.append(said)
    return "; ".join(sentences) + "."
