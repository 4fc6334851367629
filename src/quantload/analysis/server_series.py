"""The servers' view from Prometheus: busy slots, KV use, requests processing and deferred over
time, and the mean requests in flight inside each Little's-law window."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from quantload.analysis.littles_law import ServerInFlight, Window
from quantload.analysis.prom_source import TimeWindow
from quantload.observe.promql import MAX_POINTS, PrometheusClient

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
