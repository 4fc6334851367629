"""From Prometheus: the servers' view over the load phase (busy slots, KV use, requests processing
and deferred), the mean requests in flight inside each Little's-law window, and the histogram
cross-check of the exact TTFT percentiles.

The cross-check: for each complete stage, the load generator's `quantload_ttft_seconds` buckets
are differenced between the stage's start and the start of the next stage on the same server (or
a few scrapes after its end), and Prometheus' own `histogram_quantile` is run on that difference.
The estimate can only be as fine as the bucket it falls in, so each one is shown with its bucket.
When the stage lasted a few scrape intervals and the scrapes caught exactly its requests
(`prom_requests` equals the records' count), the order statistic Prometheus' rule picks (rank
q x n, i.e. numpy's 'inverted_cdf') must lie in that bucket; `same_bucket` says whether it does.
The exact value shown beside it (numpy 'linear') interpolates between order statistics and may
sit in a neighbouring bucket for small stages.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from quantload.analysis.littles_law import ServerInFlight, Window
from quantload.analysis.prometheus_source import TimeWindow
from quantload.observe.promql import MAX_POINTS, PrometheusClient, PrometheusQueryError
from quantload.stats import percentile

SERVER_SERIES: dict[str, tuple[str, str]] = {
    "slots_busy": ("busy slots", "sum by (quant) (quantload_server_slots_busy)"),
    "slots": ("slots", "sum by (quant) (quantload_server_slots)"),
    "kv_used_ratio": ("KV cells used / allocated", "max by (quant) (quantload_server_kv_cells_used_ratio)"),
    "requests_processing": ("requests processing", "sum by (quant) (llamacpp_requests_processing)"),
    "requests_deferred": ("requests deferred", "sum by (quant) (llamacpp_requests_deferred)"),
}


def label_value(text: str) -> str:
    """A string quoted for a PromQL label matcher."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def series_step_s(window: TimeWindow, scrape_interval_s: float) -> float:
    """A range-query step: the scrape interval, coarser for long windows (at most ~1,500 points)."""
    step = max(scrape_interval_s, window.length_s / 1500.0)
    return max(step, window.length_s / (MAX_POINTS - 1))


def server_series(client: PrometheusClient, window: TimeWindow, step_s: float) -> pd.DataFrame:
    """Long frame: metric, quant, unix_s, value (NaN points dropped)."""
    rows: list[dict[str, Any]] = []
    for metric, (_, expr) in SERVER_SERIES.items():
        for series in client.query_range(expr, window.start_unix_s, window.end_unix_s, step_s):
            quant = series.labels.get("quant", "")
            rows.extend(
                {"metric": metric, "quant": quant, "unix_s": t, "value": v}
                for t, v in series.points
                if math.isfinite(v)
            )
    return pd.DataFrame(rows, columns=["metric", "quant", "unix_s", "value"])


def _mean_over(client: PrometheusClient, metric: str, quant: str, window: Window) -> tuple[float, int] | None:
    selector = f"{metric}{{quant={label_value(quant)}}}"
    span = f"[{max(1, round(window.length_s * 1000))}ms]"
    mean = client.query(f"sum(avg_over_time({selector}{span}))", at=window.end_unix_s)
    count = client.query(f"max(count_over_time({selector}{span}))", at=window.end_unix_s)
    if not mean or not count or not mean[0].has_number():
        return None
    return mean[0].values()[-1], int(count[0].values()[-1])


def server_in_flight(
    client: PrometheusClient, windows: Sequence[Window], quant_of: Mapping[str, str]
) -> dict[str, ServerInFlight]:
    """Mean requests_processing (and deferred) inside each window, keyed by stage id."""
    found: dict[str, ServerInFlight] = {}
    for window in windows:
        quant = quant_of.get(window.stage_id)
        if quant is None:
            continue
        processing = _mean_over(client, "llamacpp_requests_processing", quant, window)
        if processing is None:
            continue
        deferred = _mean_over(client, "llamacpp_requests_deferred", quant, window)
        found[window.stage_id] = ServerInFlight(
            processing=processing[0], deferred=deferred[0] if deferred else None, samples=processing[1]
        )
    return found


# ----------------------------------------------------------------------------- histogram check

QUANTILES: tuple[float, ...] = (0.5, 0.99)
TTFT_BUCKETS = "quantload_ttft_seconds_bucket"
MIN_SCRAPES = 3  # a stage shorter than this many scrape intervals is shown but not judged


def _delta_expr(quant: str, experiment: str, start_s: float, end_s: float) -> str:
    selector = f"{TTFT_BUCKETS}{{quant={label_value(quant)},experiment={label_value(experiment)}}}"
    at_end = f"sum by (le) ({selector} @ {end_s:.3f})"
    at_start = f"sum by (le) ({selector} @ {start_s:.3f})"
    return f"{at_end} - ({at_start} or ({at_end} * 0))"


def _buckets(client: PrometheusClient, expr: str, at: float) -> list[tuple[float, float]]:
    """(upper bound, cumulative count) sorted by bound."""
    out = []
    for series in client.query(expr, at=at):
        bound = series.labels.get("le", "")
        out.append((math.inf if bound == "+Inf" else float(bound), series.values()[-1]))
    return sorted(out)


def bucket_of(buckets: Sequence[tuple[float, float]], q: float) -> tuple[float, float] | None:
    """The (lower, upper] bucket holding the q-quantile's rank, as histogram_quantile finds it."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower = 0.0
    for bound, cumulative in buckets:
        if cumulative >= rank:
            return lower, bound
        lower = bound
    return None


def _in_bucket(value: float | None, bucket: tuple[float, float] | None) -> bool | None:
    if value is None or bucket is None:
        return None
    return bucket[0] <= value <= bucket[1]


def _order_statistic(values: Sequence[float], q: float) -> float | None:
    return percentile(values, q * 100, method="inverted_cdf")


def _bounds(stages: pd.DataFrame, index: int, scrape_s: float) -> tuple[float, float] | None:
    stage = stages.iloc[index]
    start, end = stage["started_unix_s"], stage["ended_unix_s"]
    if start is None or end is None or pd.isna(start) or pd.isna(end):
        return None
    later = stages.iloc[index + 1 :]
    same = later[(later["server"] == stage["server"]) & (later["experiment"] == stage["experiment"])]
    next_start = same["started_unix_s"].dropna()
    stop = float(end) + 3 * scrape_s
    if len(next_start):
        stop = min(stop, float(next_start.iloc[0]))
    return float(start), stop


def histogram_check(
    client: PrometheusClient,
    stages: pd.DataFrame,
    records: pd.DataFrame,
    scrape_s: float,
    experiments: Sequence[str] = ("sweep",),
) -> pd.DataFrame:
    """One row per complete stage: exact and Prometheus TTFT p50/p99, buckets, counts."""
    rows: list[dict[str, Any]] = []
    if stages.empty:
        return pd.DataFrame()
    ordered = stages.reset_index(drop=True)
    for index, stage in ordered.iterrows():
        if stage["experiment"] not in experiments or stage["status"] != "ok":
            continue
        bounds = _bounds(ordered, int(index), scrape_s)
        if bounds is None:
            continue
        expr = _delta_expr(str(stage["quant"]), str(stage["experiment"]), *bounds)
        try:
            buckets = _buckets(client, expr, bounds[1])
            estimates = {q: client.query(f"histogram_quantile({q}, {expr})", at=bounds[1]) for q in QUANTILES}
        except PrometheusQueryError:
            continue
        ttft = records[(records["stage_id"] == stage["stage_id"]) & records["ok"] & ~records["warmup"]][
            "ttft_s"
        ].dropna()
        counted = buckets[-1][1] if buckets else 0.0
        long_enough = float(stage["ended_unix_s"]) - float(stage["started_unix_s"]) >= MIN_SCRAPES * scrape_s
        comparable = long_enough and len(ttft) > 0 and round(counted) == len(ttft)
        row: dict[str, Any] = {
            "stage_id": stage["stage_id"],
            "quant": stage["quant"],
            "users": stage["users"],
            "repeat": stage["repeat"],
            "records_ok": len(ttft),
            "prom_requests": counted,
            "comparable": comparable,
        }
        for q in QUANTILES:
            name = f"p{round(q * 100)}"
            found = estimates[q]
            value = found[0].values()[-1] if found and found[0].has_number() else None
            bucket = bucket_of(buckets, q)
            rank_value = _order_statistic(ttft.tolist(), q)
            row.update(
                {
                    f"{name}_exact_s": percentile(ttft, q * 100),
                    f"{name}_rank_s": rank_value,
                    f"{name}_prom_s": value,
                    f"{name}_bucket_low_s": bucket[0] if bucket else None,
                    f"{name}_bucket_high_s": bucket[1] if bucket else None,
                    f"{name}_same_bucket": _in_bucket(rank_value, bucket) if comparable else None,
                }
            )
        rows.append(row)
    return pd.DataFrame(rows)
