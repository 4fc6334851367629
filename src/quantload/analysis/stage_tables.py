"""From the stage summaries (and the records and stage events where a stage has none): one row per
load stage, exact, from its measured (non-warm-up) records; the figures per level (users, rate or
cache state): its percentiles from the requests of its repeats together, each with its
distribution-free confidence interval, its rates as the median of the repeats with their range,
and the SLO counts of the repeats together (what the level's verdict rests on); and the stages
where the load generator itself lagged.

Only complete stages count towards a level (status "ok", or "unrecorded" when stages.jsonl is
absent); failed, aborted and unfinished ones are named in the level's `excluded`, so the reader
sees what a figure leaves out.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.run_data import RunData
from quantload.analysis.stats import spread
from quantload.load.records import StageEvent
from quantload.load.summary import StageSummary, new_figures, summarize
from quantload.slo import PERCENTILES, Slo, SloCounts
from quantload.slo import total as sum_counts
from quantload.stats import percentile, percentile_interval

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


def _value(row: Any, name: str) -> Any:
    value = row.get(name) if isinstance(row, dict) else getattr(row, name, None)
    return None if value is None or (isinstance(value, float) and math.isnan(value)) else value


def stage_line(head: dict[str, Any], event: str) -> StageEvent:
    """A stage line from what a frame row knows of it (a record's labels when no line exists)."""
    users, rate = _value(head, "stage_users"), _value(head, "stage_rate_rps")
    return StageEvent(
        event=event,  # type: ignore[arg-type]
        unix_s=_value(head, "unix_s") or 0.0,
        run_id=str(_value(head, "run_id") or ""),
        server=str(_value(head, "server") or ""),
        quant=str(_value(head, "quant") or ""),
        model=str(_value(head, "model") or ""),
        experiment=str(_value(head, "experiment") or ""),
        stage_id=str(_value(head, "stage_id") or ""),
        stage_index=int(_value(head, "stage_index") or 0),
        stage_users=int(users) if users is not None else None,
        stage_rate_rps=float(rate) if rate is not None else None,
        arrival=_value(head, "arrival"),
        repeat=int(_value(head, "repeat") or 0),
        cache_prompt=bool(_value(head, "cache_prompt")),
        requests_planned=int(_value(head, "requests_planned") or 0),
        **{
            name: _value(head, name)
            for name in (
                "kv_cache_type", "status", "reason", "prefix_tokens", "server_state", "workload",
                "phase", "server_args", "warning", "template_overhead_tokens", "client_cpu_frac",
                "client_cpu_total_frac", "loop_lag_p99_s", "client_saturated", "client_rss_bytes",
                "client_trust", "client_trust_why", "context_policy", "slot_context_tokens", "client_error_s",
            )
            if _value(head, name) is not None
        },
    )  # fmt: skip


def summary_from_records(
    frame: pd.DataFrame, end: StageEvent, slo: Slo, start: StageEvent | None = None
) -> StageSummary:
    """The stage's summary from its measured records in the frame: quantload.load.summary's own
    computation (a frame keeps no inter-token gaps, so the ITL percentiles are left empty)."""
    figures = new_figures(end, slo)
    for row in frame.to_dict("records"):
        tokens = _value(row, "completion_tokens")
        prompt = _value(row, "prompt_tokens")
        figures.add(
            ok=bool(row["ok"]),
            within_deadline=bool(row["within_deadline"]),
            error_class=_value(row, "error_class"),
            lag_s=_value(row, "lag_s"),
            sent_unix_s=_value(row, "sent_unix_s"),
            ttft_s=_value(row, "ttft_s"),
            ttft_from_intended_s=_value(row, "ttft_from_intended_s"),
            tpot_s=_value(row, "tpot_s"),
            e2e_s=_value(row, "e2e_s"),
            completion_tokens=int(tokens) if tokens is not None else None,
            prompt_tokens=int(prompt) if prompt is not None else None,
            cache_n=_value(row, "cache_n"),
            itl_s=None,
        )
    return summarize(end, figures, start)


def _row(summary: StageSummary) -> dict[str, Any]:
    row = summary.model_dump(exclude={"schema_", "slo_counts"})
    row.update({f"slo_{name}": count for name, count in summary.slo_counts.items()})
    row["failed_frac"] = summary.failed_frac
    row["good_frac"] = summary.good_frac
    return row


def _one_stage(
    stage_id: str,
    frame: pd.DataFrame,
    start: dict[str, Any],
    end: dict[str, Any],
    stored: StageSummary | None,
    slo: Slo,
    no_stage_lines: bool,
) -> dict[str, Any]:
    """A stage's row: its stored summary where it was judged against this SLO, else the same
    summary computed from its records."""
    if stored is not None and stored.judged_with(slo) and end:
        return _row(stored)
    head: dict[str, Any] = end or start or (frame.iloc[0].to_dict() if not frame.empty else {})
    head = {**head, "stage_id": stage_id}
    start_line = stage_line(start, "stage_start") if start else None
    summary = summary_from_records(frame, stage_line(head, "stage_end"), slo, start_line)
    if stored is not None:  # what only the load saw: the machine's other work during the stage
        summary = summary.model_copy(
            update={"other_cpu_frac": stored.other_cpu_frac, "machine_busy": stored.machine_busy}
        )
    row = _row(summary)
    if not end:
        row["ended_unix_s"] = None
        row["status"] = UNRECORDED if no_stage_lines else UNFINISHED
        row["reason"] = (
            "stages.jsonl is absent"
            if no_stage_lines
            else "no stage_end line: the run stopped inside this stage"
        )
    return row


def stage_table(run: RunData, judged: Slo) -> pd.DataFrame:
    """Every stage that has measured records or a stage_end line, in the order they ran: its
    summary as the load wrote it (summaries.jsonl), or computed alike from its records."""
    records = run.records
    measured = records[~records["warmup"] & records["experiment"].ne("warmup")]
    starts, ends = _stage_events(run.stages)
    ids: list[str] = list(dict.fromkeys([*ends, *measured["stage_id"].dropna().astype(str).tolist()]))
    by_stage = dict(tuple(measured.groupby("stage_id", sort=False))) if not measured.empty else {}
    rows = []
    for stage_id in ids:
        frame = by_stage.get(stage_id, measured.iloc[0:0])
        rows.append(
            _one_stage(
                stage_id, frame, starts.get(stage_id, {}), ends.get(stage_id, {}),
                run.summaries.get(stage_id), judged, run.stages.empty,
            )
        )
    table = pd.DataFrame(rows)
    if table.empty:
        return table
    order = table["started_unix_s"].fillna(table["first_sent_unix_s"]).fillna(table["ended_unix_s"])
    return table.assign(_order=order).sort_values("_order", kind="stable").drop(columns="_order")


# ----------------------------------------------------------------------------- levels

# Percentiles of a level: from its repeats' requests together, with their intervals ({name: (column
# of records.jsonl, percentile)}; "at_slo" means the SLO's own percentile, TTFT as the SLO judges it).
LEVEL_PERCENTILES: dict[str, tuple[str, float | str]] = {
    "ttft_p50_s": ("ttft_s", 50),
    "ttft_p99_s": ("ttft_s", 99),
    "ttft_from_intended_p50_s": ("ttft_from_intended_s", 50),
    "ttft_from_intended_p99_s": ("ttft_from_intended_s", 99),
    "tpot_p50_s": ("tpot_s", 50),
    "tpot_p99_s": ("tpot_s", 99),
    "e2e_p50_s": ("e2e_s", 50),
    "ttft_at_slo_s": ("judged_ttft_s", "ttft"),
    "tpot_at_slo_s": ("tpot_s", "tpot"),
}
LEVEL_METRICS: tuple[str, ...] = (
    "ttft_p50_s",
    "ttft_p99_s",
    "ttft_from_intended_p50_s",
    "ttft_from_intended_p99_s",
    "tpot_p50_s",
    "tpot_p99_s",
    "e2e_p50_s",
    "ttft_at_slo_s",
    "tpot_at_slo_s",
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


SLO_COUNT_COLUMNS: tuple[str, ...] = tuple(f"slo_{name}" for name in SloCounts().to_dict())


def stage_counts(row: Any) -> SloCounts:
    """The SLO counts of one stage row (zeros where the row has none; block sums of counts written
    before they were kept read as isolated overs)."""
    values = {name: _value(row, f"slo_{name}") for name in SloCounts().to_dict()}
    return SloCounts.from_dict(values)


def level_counts(row: Any) -> SloCounts:
    """A level row's SLO counts: its usable repeats together."""
    return stage_counts(row)


def _pooled(
    records: pd.DataFrame | None, stage_ids: Sequence[str], slo: Slo, open_loop: bool
) -> dict[str, Any]:
    """The level's percentiles from its stages' measured ok requests together, with their intervals."""
    if records is None or records.empty or not stage_ids:
        return {}
    mine = records[records["stage_id"].isin(stage_ids) & records["ok"].astype(bool) & ~records["warmup"]]
    if mine.empty:
        return {}
    judged = mine["ttft_s"]
    if open_loop and "ttft_from_intended_s" in mine:
        judged = mine["ttft_from_intended_s"].where(mine["ttft_from_intended_s"].notna(), mine["ttft_s"])
    shares = {"ttft": PERCENTILES[slo.ttft_percentile] * 100, "tpot": PERCENTILES[slo.tpot_percentile] * 100}
    out: dict[str, Any] = {}
    for name, (column, q) in LEVEL_PERCENTILES.items():
        if column == "judged_ttft_s":
            values = judged.tolist()
        else:
            values = mine[column].tolist() if column in mine else []
        at = shares[q] if isinstance(q, str) else float(q)
        value = percentile(values, at)
        if value is None:
            continue
        out[name] = value
        out[f"{name}_ci"] = percentile_interval(values, at, slo.confidence)
    return out


def level_table(
    stages: pd.DataFrame,
    experiment: str,
    key: str,
    quant_order: Sequence[str],
    records: pd.DataFrame | None = None,
    slo: Slo | None = None,
) -> pd.DataFrame:
    """One row per (quant, `key`) of `experiment`: each metric's median, _min and _max over repeats,
    the SLO counts of its usable repeats together (`slo_*`), and, given the records and the SLO,
    its percentiles from those repeats' requests together with their intervals (`<name>_ci`)."""
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
        repeats = [stage_counts(stage) for stage in used.to_dict("records")]
        row.update({f"slo_{name}": count for name, count in sum_counts(repeats).to_dict().items()})
        for metric in LEVEL_METRICS:
            found = spread(used[metric]) if metric in used else None
            row[metric] = found.median if found else None
            row[f"{metric}_min"] = found.low if found else None
            row[f"{metric}_max"] = found.high if found else None
        if slo is not None:
            open_loop = key == "rate_rps"
            row.update(_pooled(records, used["stage_id"].astype(str).tolist(), slo, open_loop))
        if "client_trust" in used:
            untrusted = used[used["client_trust"].isin(("degraded", "saturated"))].to_dict("records")
            reasons = [str(_value(stage, "client_trust_why") or stage["client_trust"]) for stage in untrusted]
            row["client_untrusted"] = "; ".join(dict.fromkeys(reasons)) or None
        if "machine_busy" in used:
            busy = [str(why) for why in used["machine_busy"] if isinstance(why, str) and why]
            row["machine_busy"] = "; ".join(dict.fromkeys(busy)) or None
        if "delivered_concurrency" in used:
            concurrency = used["delivered_concurrency"].dropna()
            row["delivered_concurrency"] = float(concurrency.max()) if not concurrency.empty else None
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
    """Stages whose send-lag p99 is above `threshold_s`, whose stage_end says the client saturated,
    or whose figures it says may be worse than stated (client_trust "degraded")."""
    if stages.empty:
        return stages
    lag = stages["lag_p99_s"].astype(float).fillna(0.0)
    saturated = stages["client_saturated"].eq(True)
    trust = stages["client_trust"] if "client_trust" in stages else pd.Series(None, index=stages.index)
    degraded = trust.eq("degraded")
    flagged = stages[(lag > threshold_s) | saturated | degraded].copy()
    flagged["why"] = [
        "; ".join(
            part
            for part in (
                f"send lag p99 {fmt.duration(row.lag_p99_s)} > {fmt.duration(threshold_s)}"
                if (row.lag_p99_s or 0.0) > threshold_s
                else "",
                "stage_end says the client saturated (CPU or event-loop lag)" if row.client_saturated else "",
                f"figures may be worse than stated: {_value(row, 'client_trust_why')}"
                if _value(row, "client_trust") == "degraded"
                else "",
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
            f" (threshold {fmt.duration(threshold_s)}), no stage reported saturation or figures worse"
            " than the client is stated to measure."
        )
    degraded = int(flagged["client_trust"].eq("degraded").sum()) if "client_trust" in flagged else 0
    lagged = len(flagged) - degraded
    parts = []
    if lagged:
        parts.append(
            f"The load generator lagged in {lagged} of {fmt.counted(len(stages), 'stage')}: their"
            " latencies include client delay and understate what the server could do"
        )
    if degraded:
        parts.append(
            f"in {degraded} of {fmt.counted(len(stages), 'stage')} the client's own timing error may"
            " be larger than the error it is stated within (its event loop woke up late, or it held more"
            " streams per process than this machine's calibration proved): read their latencies as upper"
            " bounds"
        )
    text = "; ".join(parts)
    return (
        f"{text[0].upper()}{text[1:]}; rerun with more Locust workers (load.workers) or on a machine"
        " with spare cores, and `quantload calibrate` says what this machine's client measures right."
    )
