"""summary.json (schema quantload.report/1): the report's figures for machines to read."""

from __future__ import annotations

import math
from typing import Any

import pandas as pd

from quantload.analysis.analyze import Analysis
from quantload.analysis.capacity import slo_text
from quantload.analysis.stats import PERCENTILE_METHOD, PERCENTILE_METHOD_TEXT

SUMMARY_SCHEMA = "quantload.report/1"


def clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become None, numpy scalars plain numbers, tuples lists."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is pd.NA or value is pd.NaT:
        return None
    return value


def _records(frame: pd.DataFrame) -> list[dict[str, Any]]:
    return [clean(row) for row in frame.to_dict("records")] if not frame.empty else []


def summary(analysis: Analysis, files: dict[str, Any]) -> dict[str, Any]:
    """Everything the report shows, as one JSON object."""
    data: dict[str, Any] = clean(
        {
            "schema": SUMMARY_SCHEMA,
            "run_id": analysis.header.run_id,
            "header": analysis.header.to_dict(),
            "slo": {**analysis.slo.model_dump(mode="json"), "text": slo_text(analysis.slo)},
            "percentile_method": {"numpy_method": PERCENTILE_METHOD, "text": PERCENTILE_METHOD_TEXT},
            "quants": list(analysis.quants),
            "capacity": [verdict.to_dict() for verdict in analysis.capacity],
            "table": _records(analysis.seed),
            "sweep_levels": _records(analysis.levels),
            "open_loop_levels": _records(analysis.open_loop),
            "stages": _records(analysis.stages),
            "ttft_split": _records(analysis.ttft_split),
            "prompt_cache": [item.to_dict() for item in analysis.prompt_cache],
            "kv": [row.to_dict() for row in analysis.kv],
            "roofline": _records(analysis.roofline),
            "littles_law": _records(analysis.littles_law),
            "client": {"sentence": analysis.client_sentence, "lagging_stages": _records(analysis.lagging)},
            "prometheus": {
                "origin": analysis.prometheus_origin or None,
                "histogram_check": _records(analysis.histogram_check),
                "series_points": len(analysis.server_series),
            },
            "not_measured": [gap.to_dict() for gap in analysis.gaps],
            "notes": list(analysis.notes),
            "files": files,
        }
    )
    return data
