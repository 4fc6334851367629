"""Speculative decoding, from the speculation experiment's stages, records and variants.

Per quantization, way of speculating (the variant's label: "spec off", "spec ngram ...",
"spec draft ...", "spec synth L"), traffic kind (`repeat`: prompts asking to repeat or edit a given
text; `free`: the prompt set) and users (1, and the limit): the requests, TPOT p50 (client side),
decode tokens/s p50 (each request's completion tokens over the server's own `predicted_ms`),
output tokens/s over the stage, and their speed-up against speculation off on the same traffic at
the same users; the acceptance rate from the requests' own `timings` (draft tokens accepted over
drafted) and, per variant, from the server's `/metrics` counters (variants.jsonl); drafted tokens
per request. A variant that did not speculate (variants.jsonl: its log, its `/slots`, or no draft
counted) is shown with that reason and never with a speed-up. A speed-up is a decided comparison
(quantload.comparison): the per-request decode speeds' medians with their bootstrap interval, a
faster or slower variant only where the interval shows it, else "no difference shown".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.stage_tables import USABLE
from quantload.comparison import compare_medians
from quantload.experiments.speculation.stages import NAME
from quantload.experiments.variant_file import VariantLine
from quantload.stats import percentile

OFF = "spec off"


def _kind(label: str) -> str:
    parts = label.split()
    return parts[1] if len(parts) > 1 else label


def speculation_table(
    records: pd.DataFrame, stages: pd.DataFrame, variants: Sequence[VariantLine], quant_order: Sequence[str]
) -> pd.DataFrame:
    """One row per (quant, variant, traffic, users) of the speculation stages (see the docstring)."""
    if records.empty or stages.empty or "server_args" not in stages:
        return pd.DataFrame()
    chosen = stages[(stages["experiment"] == NAME) & stages["status"].isin(USABLE)]
    if chosen.empty:
        return pd.DataFrame()
    checks = {(v.quant, v.label): v for v in variants if v.experiment == NAME}
    rank = {quant: index for index, quant in enumerate(quant_order)}
    rows: list[dict[str, Any]] = []
    decode_of: dict[tuple[str, str, str, int], list[float]] = {}  # per-request decode tok/s
    for (quant, label, phase, users), group in chosen.groupby(
        ["quant", "server_args", "phase", "users"], sort=False
    ):
        mine = records[records["stage_id"].isin(group["stage_id"]) & ~records["warmup"] & records["ok"]]
        decode = (mine["completion_tokens"] / (mine["predicted_ms"] / 1000.0)).dropna()
        decode_of[(str(quant), str(label), str(phase), int(users))] = decode.tolist()
        drafted = float(mine["draft_n"].fillna(0).sum())
        accepted = float(mine["draft_n_accepted"].fillna(0).sum())
        variant = checks.get((str(quant), str(label)))
        check = variant.speculation if variant is not None else None
        rows.append(
            {
                "quant": quant,
                "variant": label,
                "kind": _kind(str(label)),
                "traffic": str(phase).removesuffix(" traffic"),
                "users": int(users),
                "requests": len(mine),
                "tpot_p50_s": percentile(mine["tpot_s"].dropna(), 50),
                "decode_tok_s_p50": percentile(decode, 50),
                "output_tok_s": fmt.cell_float(group["output_tok_s"].median()),
                "drafted_per_request": drafted / len(mine) if len(mine) else None,
                "acceptance": accepted / drafted if drafted else None,
                "speculating": None if check is None else check.speculating,
                "why": check.why if check is not None else "",
                "server_acceptance": check.acceptance if check is not None else None,
                "server_draft_tokens": check.draft_tokens if check is not None else None,
                "_rank": rank.get(str(quant), len(rank)),
            }
        )
    table = pd.DataFrame(rows)
    _decide_speedups(table, decode_of)
    base = table[table["variant"] == OFF].set_index(["quant", "traffic", "users"])
    for column, base_column, invert in (
        ("decode_speedup", "decode_tok_s_p50", False),
        ("output_speedup", "output_tok_s", False),
        ("tpot_speedup", "tpot_p50_s", True),
    ):
        values: list[float | None] = []
        for row in table.to_dict("records"):
            key = (row["quant"], row["traffic"], row["users"])
            mine = row[base_column]
            theirs = base[base_column].get(key) if key in base.index else None
            if row["speculating"] is False or mine is None or theirs is None or not theirs or not mine:
                values.append(None)
            else:
                values.append(float(theirs) / float(mine) if invert else float(mine) / float(theirs))
        table[column] = values
    table = table.sort_values(["_rank", "traffic", "users"], kind="stable").drop(columns="_rank")
    return table.reset_index(drop=True)


def _decide_speedups(table: pd.DataFrame, decode_of: dict[tuple[str, str, str, int], list[float]]) -> None:
    """Each variant's decode speed against speculation off at the same cell, decided
    (quantload.comparison: the ratio of the per-request medians with its bootstrap interval)."""
    lows: list[float | None] = []
    highs: list[float | None] = []
    shown: list[str | None] = []
    for row in table.to_dict("records"):
        phase = f"{row['traffic']} traffic"
        key = (str(row["quant"]), str(row["variant"]), phase, int(row["users"]))
        off = decode_of.get((str(row["quant"]), OFF, phase, int(row["users"])))
        mine = decode_of.get(key)
        if row["variant"] == OFF or row["speculating"] is False or not off or not mine:
            lows.append(None)
            highs.append(None)
            shown.append(None)
            continue
        comparison = compare_medians(mine, off)
        lows.append(comparison.low)
        highs.append(comparison.high)
        shown.append(comparison.better)
    table["decode_speedup_low"] = lows
    table["decode_speedup_high"] = highs
    table["decode_faster"] = shown  # "a": the variant decodes faster, "b": slower, None: no difference shown


def _speedup_words(best: dict[str, Any]) -> str:
    interval = f"[{fmt.number(fmt.cell_float(best.get('decode_speedup_low')), 2)},"
    interval += f" {fmt.number(fmt.cell_float(best.get('decode_speedup_high')), 2)}]"
    said = f"x{best['decode_speedup']:.2f} {interval}"
    if best.get("decode_faster") == "a":
        return f"{said} decode tok/s"
    if best.get("decode_faster") == "b":
        return f"slower, {said} decode tok/s"
    return f"no difference shown ({said} decode tok/s)"


def speculation_verdict(table: pd.DataFrame) -> str:
    """One sentence per quantization: the best speed-up per traffic kind at 1 user and at the limit,
    with its acceptance; the ways that did not speculate, and why."""
    if table.empty:
        return "not measured: no complete speculation stage"
    sentences = []
    for quant, group in table.groupby("quant", sort=False):
        parts = []
        for (traffic, users), cell in group.groupby(["traffic", "users"], sort=False):
            measured = cell[cell["decode_speedup"].notna() & (cell["variant"] != OFF)]
            if measured.empty:
                continue
            best = measured.loc[measured["decode_speedup"].idxmax()].to_dict()
            parts.append(
                f"{traffic} traffic at {users} user{'s' if users != 1 else ''}: {_speedup_words(best)}"
                f" with {best['variant'].removeprefix('spec ')}"
                f" ({fmt.percent(fmt.cell_float(best['acceptance']), 0)} of drafts accepted)"
            )
        failed = group[group["speculating"].eq(False)]["variant"].unique()
        said = f"{quant}: " + ("; ".join(parts) if parts else "no speed-up measured")
        if len(failed):
            said += f"; not speculating, so not counted: {', '.join(failed)}"
        sentences.append(said)
    return "; ".join(sentences) + "."
