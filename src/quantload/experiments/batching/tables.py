"""Continuous against static batching, from the batching experiment's stages and records.

Per quantization, batching mode (`server_args` "-cb" or "-nocb") and part (`phase` "closed" at
the limit, "poisson" near it): TTFT p50 and p99 (in open loop from the intended send time), ITL
p99 (every gap of every request, from the stage summary), output tokens/s and requests/s over the
stage, goodput, and how long new arrivals waited behind running generations:

  wait        a request's TTFT less the server's own prefill time for it (`timings.prompt_ms`):
              the time it spent queued before its prompt was processed (plus the network and
              the first token's sampling, both small here); from the intended send time in open
              loop, so a request the client sent late still counts its wait
  behind      the requests that arrived (were sent, or due, in open loop) while at least one
              other request of the same stage was generating: after that one's first token and
              before its last. Their wait is what static batching makes them pay: with -nocb a
              pending prompt is admitted only when no slot is generating

Repeats are pooled. The verdict compares -nocb with -cb at the closed-loop limit (TTFT p99 and
the wait behind running generations) and says what throughput each delivered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.stage_tables import USABLE
from quantload.experiments.batching.stages import NAME
from quantload.stats import percentile

MODES = {"-cb": "continuous", "-nocb": "static"}
PHASES = ("closed", "poisson")


def request_waits(group: pd.DataFrame, open_loop: bool) -> pd.DataFrame:
    """Each ok request of one stage with its wait and whether it arrived behind a generation."""
    ok = group[group["ok"]].copy()
    if ok.empty:
        return ok.assign(wait_s=[], behind=[])
    ttft = ok["ttft_from_intended_s"] if open_loop else ok["ttft_s"]
    prefill_s = ok["prompt_ms"].astype(float) / 1000.0
    ok["wait_s"] = (ttft.astype(float) - prefill_s.fillna(0.0)).clip(lower=0.0)
    arrival = (ok["intended_unix_s"] if open_loop else ok["sent_unix_s"]).to_numpy(dtype=float)
    first = (ok["sent_unix_s"] + ok["ttft_s"]).to_numpy(dtype=float)
    last = ok["end_unix_s"].to_numpy(dtype=float)
    behind = []
    for index, arrived in enumerate(arrival):
        generating = (first < arrived) & (last > arrived)
        generating[index] = False
        behind.append(bool(np.any(generating)))
    ok["behind"] = behind
    return ok


def batching_table(records: pd.DataFrame, stages: pd.DataFrame, quant_order: Sequence[str]) -> pd.DataFrame:
    """One row per (quant, batching mode, phase) of the complete batching stages (see the docstring)."""
    if records.empty or stages.empty or "server_args" not in stages:
        return pd.DataFrame()
    usable = stages[(stages["experiment"] == NAME) & stages["status"].isin(USABLE)]
    if usable.empty:
        return pd.DataFrame()
    rank = {quant: index for index, quant in enumerate(quant_order)}
    rows: list[dict[str, Any]] = []
    for (quant, args, phase), group in usable.groupby(["quant", "server_args", "phase"], sort=False):
        open_loop = phase == "poisson"
        chosen = records[records["stage_id"].isin(group["stage_id"]) & ~records["warmup"]]
        waits = pd.concat(
            [request_waits(stage, open_loop) for _, stage in chosen.groupby("stage_id", sort=False)]
            or [chosen.iloc[0:0].assign(wait_s=[], behind=[])]
        )
        ttft = waits["ttft_from_intended_s"] if open_loop else waits["ttft_s"]
        behind = waits[waits["behind"]] if not waits.empty else waits
        rows.append(
            {
                "quant": quant,
                "server_args": args,
                "batching": MODES.get(str(args), str(args)),
                "phase": phase,
                "users": float(group["users"].iloc[0]) if not open_loop else None,
                "rate_rps": float(group["rate_rps"].iloc[0]) if open_loop else None,
                "requests": int(group["requests"].sum()),
                "ok": int(group["ok"].sum()),
                "ttft_p50_s": percentile(ttft.dropna(), 50),
                "ttft_p99_s": percentile(ttft.dropna(), 99),
                "itl_p99_s": fmt.cell_float(group["itl_p99_s"].median()) if "itl_p99_s" in group else None,
                "output_tok_s": fmt.cell_float(group["output_tok_s"].median()),
                "requests_per_s": fmt.cell_float(group["requests_per_s"].median()),
                "goodput_rps": fmt.cell_float(group["goodput_rps"].median()),
                "wait_p50_s": percentile(waits["wait_s"].dropna(), 50),
                "wait_p99_s": percentile(waits["wait_s"].dropna(), 99),
                "behind": len(behind),
                "behind_wait_p50_s": percentile(behind["wait_s"].dropna(), 50),
                "behind_wait_p99_s": percentile(behind["wait_s"].dropna(), 99),
                "_rank": rank.get(str(quant), len(rank)),
                "_phase": PHASES.index(str(phase)) if phase in PHASES else len(PHASES),
                "_mode": list(MODES).index(str(args)) if args in MODES else len(MODES),
            }
        )
    table = pd.DataFrame(rows).sort_values(["_rank", "_phase", "_mode"], kind="stable")
    return table.drop(columns=["_rank", "_phase", "_mode"]).reset_index(drop=True)


def _row(table: pd.DataFrame, quant: str, args: str, phase: str) -> dict[str, Any] | None:
    found = table[(table["quant"] == quant) & (table["server_args"] == args) & (table["phase"] == phase)]
    return dict(found.iloc[0]) if not found.empty else None


def _times(mine: float | None, theirs: float | None) -> str:
    return f" (x{mine / theirs:.1f})" if mine is not None and theirs else ""


def batching_verdict(table: pd.DataFrame) -> str:
    """One sentence: what static batching did to TTFT and to the wait of new arrivals at the limit."""
    if table.empty:
        return "not measured: no complete batching stage"
    sentences = []
    for quant in dict.fromkeys(table["quant"]):
        cb, nocb = _row(table, str(quant), "-cb", "closed"), _row(table, str(quant), "-nocb", "closed")
        if cb is None or nocb is None:
            continue
        users = int(cb["users"]) if cb["users"] is not None else None
        said = (
            f"{quant} at {users} users: static batching (-nocb) took TTFT p99 from"
            f" {fmt.duration(cb['ttft_p99_s'])} to {fmt.duration(nocb['ttft_p99_s'])}"
            f"{_times(nocb['ttft_p99_s'], cb['ttft_p99_s'])}; requests waited before their prefill p99"
            f" {fmt.duration(nocb['wait_p99_s'])} against {fmt.duration(cb['wait_p99_s'])}"
        )
        if nocb["behind"]:
            said += (
                f" ({nocb['behind']} arrived behind a running generation and waited p50"
                f" {fmt.duration(nocb['behind_wait_p50_s'])})"
            )
        said += (
            f", and it delivered {fmt.number(nocb['output_tok_s'], 1)} against"
            f" {fmt.number(cb['output_tok_s'], 1)} output tok/s"
        )
        sentences.append(said)
    if not sentences:
        return "not measured: no closed-loop pair of -cb and -nocb stages"
    return "; ".join(sentences) + "."
