"""From the records and stage events: one row per load stage, computed exactly from its measured
(non-warm-up) records; the figures per level (users, rate or cache state) as the median of the
repeats with their range; and the stages where the load generator itself lagged.

Only complete stages count towards a level (status "ok", or "unrecorded" when stages.jsonl is
absent); failed, aborted and unfinished ones are named in the level's `excluded`, so the reader
sees what a figure leaves out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.run_data import RunData
from quantload.analysis.stats import mean, spread
from quantload.config import ReportSettings
from quantload.stats import finite, percentile

UNFINISHED = "unfinished"  # records but no stage_end line: the run stopped inside the stage
UNRECORDED = "unrecorded"  # stages.jsonl absent: completeness unknown, the records are used as they are
USABLE = ("ok", UNRECORDED)


def _stage_events(stages: pd.DataFrame) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    starts: dict[str, dict[str, Any]] = {}
    ends: dict[str, dict[str, Any]] = {}
    for event in stages.to_dict("records"):
        target = starts if event["event"] == "stage_start" else ends
        target[str(event["stage_id"])] = event
    return starts, ends


def _good(frame: pd.DataFrame, slo: ReportSettings) -> int:
    """Requests that succeeded within their deadline and met both SLO limits on their own.

    Goodput in the DistServe sense. In open loop TTFT is judged from the intended send time, so a
    client that fell behind its schedule cannot hide the wait (coordinated omission).
    """
    ok = frame[frame["ok"] & frame["within_deadline"]]
    open_loop = ok["experiment"].eq("open_loop") & ok["ttft_from_intended_s"].notna()
    ttft = ok["ttft_from_intended_s"].where(open_loop, ok["ttft_s"])
    ttft_ok = ttft.le(slo.slo_ttft_p99_s)
    tpot_ok = ok["tpot_s"].isna() | ok["tpot_s"].le(slo.slo_tpot_s)
    return int((ttft_ok & tpot_ok).sum())


def _latency(ok: pd.DataFrame) -> dict[str, float | None]:
    return {
        "ttft_p50_s": percentile(ok["ttft_s"], 50),
        "ttft_p99_s": percentile(ok["ttft_s"], 99),
        "tpot_p50_s": percentile(ok["tpot_s"], 50),
        "tpot_p99_s": percentile(ok["tpot_s"], 99),
        "e2e_p50_s": percentile(ok["e2e_s"], 50),
        "e2e_mean_s": mean(ok["e2e_s"]),
        "ttft_from_intended_p50_s": percentile(ok["ttft_from_intended_s"], 50),
        "ttft_from_intended_p99_s": percentile(ok["ttft_from_intended_s"], 99),
    }


def _throughput(ok: pd.DataFrame, good: int) -> dict[str, float | None]:
    sent, ended = finite(ok["sent_unix_s"]), finite(ok["end_unix_s"])
    span = (max(ended) - min(sent)) if sent and ended else 0.0
    tokens = float(sum(finite(ok["completion_tokens"])))
    return {
        "first_sent_unix_s": min(sent) if sent else None,
        "last_end_unix_s": max(ended) if ended else None,
        "span_s": span if span > 0 else None,
        "output_tokens": tokens,
        "output_tok_s": tokens / span if span > 0 else None,
        "requests_per_s": len(ok) / span if span > 0 else None,
        "goodput_rps": good / span if span > 0 else None,
    }


def _one_stage(
    stage_id: str,
    frame: pd.DataFrame,
    start: dict[str, Any],
    end: dict[str, Any],
    slo: ReportSettings,
    no_stage_lines: bool,
) -> dict[str, Any]:
    head: dict[str, Any] = end or start or (frame.iloc[0].to_dict() if not frame.empty else {})
    ok = frame[frame["ok"]]
    failed = frame[~frame["ok"]]
    errors = failed["error_class"].fillna("client_error").value_counts().to_dict()
    good = _good(frame, slo)
    requests = len(frame)
    row: dict[str, Any] = {
        "stage_id": stage_id,
        "quant": head.get("quant"),
        "server": head.get("server"),
        "experiment": head.get("experiment"),
        "users": head.get("stage_users"),
        "rate_rps": head.get("stage_rate_rps"),
        "repeat": head.get("repeat"),
        "cache_prompt": bool(head.get("cache_prompt")),
        "status": end.get("status") if end else (UNRECORDED if no_stage_lines else UNFINISHED),
        "reason": end.get("reason")
        if end
        else "stages.jsonl is absent"
        if no_stage_lines
        else "no stage_end line: the run stopped inside this stage",
        "started_unix_s": start.get("unix_s") if start else None,
        "ended_unix_s": end.get("unix_s") if end else None,
        "requests": requests,
        "ok": len(ok),
        "failed": len(failed),
        "failed_frac": len(failed) / requests if requests else None,
        "errors": {str(k): int(v) for k, v in errors.items()},
        "good": good,
        "good_frac": good / requests if requests else None,
        "lag_p99_s": percentile(frame["lag_s"], 99),
        "lag_max_s": max(finite(frame["lag_s"]), default=None),
        "client_saturated": end.get("client_saturated") if end else None,
        "loop_lag_p99_s": end.get("loop_lag_p99_s") if end else None,
        "client_cpu_frac": end.get("client_cpu_frac") if end else None,
        "cache_n_mean": mean(ok["cache_n"]),
        "prompt_tokens_mean": mean(ok["prompt_tokens"]),
        "prefix_tokens": head.get("prefix_tokens"),
        "server_state": head.get("server_state"),
        "kv_cache_type": head.get("kv_cache_type"),
        "workload": head.get("workload"),
        "phase": head.get("phase"),
        "server_args": head.get("server_args"),
        "warning": head.get("warning"),
        "lag_p50_s": percentile(frame["lag_s"], 50),
    }
    row.update(_latency(ok))
    row.update(_throughput(ok, good))
    return row


def stage_table(run: RunData, slo: ReportSettings) -> pd.DataFrame:
    """Every stage that has measured records or a stage_end line, in the order they ran."""
    records = run.records
    measured = records[~records["warmup"] & records["experiment"].ne("warmup")]
    starts, ends = _stage_events(run.stages)
    ids: list[str] = list(dict.fromkeys([*ends, *measured["stage_id"].dropna().astype(str).tolist()]))
    rows = []
    for stage_id in ids:
        frame = measured[measured["stage_id"] == stage_id]
        rows.append(
            _one_stage(
                stage_id, frame, starts.get(stage_id, {}), ends.get(stage_id, {}), slo, run.stages.empty
            )
        )
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    order = table["started_unix_s"].fillna(table["first_sent_unix_s"]).fillna(table["ended_unix_s"])
    return table.assign(_order=order).sort_values("_order", kind="stable").drop(columns="_order")


# ----------------------------------------------------------------------------- levels

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


# ----------------------------------------------------------------------------- the load generator's health


def lagging_stages(stages: pd.DataFrame, threshold_s: float) -> pd.DataFrame:
    """Stages whose send-lag p99 is above `threshold_s` or whose stage_end says the client saturated."""
    if stages.empty:
        return stages
    lag = stages["lag_p99_s"].astype(float).fillna(0.0)
    saturated = stages["client_saturated"].eq(True)
    flagged = stages[(lag > threshold_s) | saturated].copy()
    flagged["why"] = [
        "; ".join(
            part
            for part in (
                f"send lag p99 {fmt.duration(row.lag_p99_s)} > {fmt.duration(threshold_s)}"
                if (row.lag_p99_s or 0.0) > threshold_s
                else "",
                "stage_end says the client saturated (CPU or event-loop lag)" if row.client_saturated else "",
            )
            if part
        )
        for row in flagged.itertuples()
    ]
    return flagged


def client_verdict(stages: pd.DataFrame, flagged: pd.DataFrame, threshold_s: float) -> str:
    """One sentence on the load generator's health."""
    if stages.empty:
        return "not measured: no load stages"
    worst = stages["lag_p99_s"].astype(float).max()
    if flagged.empty:
        return (
            f"The load generator kept up in every stage: send lag p99 at most {fmt.duration(worst)}"
            f" (threshold {fmt.duration(threshold_s)}), no stage reported saturation."
        )
    return (
        f"The load generator lagged in {len(flagged)} of {len(stages)} stage(s): their latencies include"
        " client delay and understate what the server could do; rerun with more Locust workers"
        " (load.workers) or on a machine with spare cores."
    )
