"""Small helpers the section builders share: values, gap notes, cache-state lines, images."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.document import (
    Block,
    Bullets,
    Image,
    Paragraph,
)

PLOT_TITLES: dict[str, str] = {
    "ttft_vs_concurrency": "TTFT p50 and p99 against concurrency",
    "throughput_vs_concurrency": "Output tokens/s against concurrency",
    "latency_vs_throughput": "Latency against throughput",
    "quality_speed_size": "Quality against decode speed and file size",
    "server_timeseries": "Server-side time series with stage boundaries",
}


def value(value: Any) -> float | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return None if pd.isna(value) else float(value)
    except (TypeError, ValueError):
        return None


def gap_blocks(analysis: Analysis, *sections: str) -> list[Block]:
    lines = [gap.text() for gap in analysis.gaps if gap.section in sections]
    return [Bullets(tuple(dict.fromkeys(lines)), "warning")] if lines else []


def cache_state_block(analysis: Analysis, label: str) -> list[Block]:
    for name, text in analysis.header.cache_states:
        if name == label:
            return [Paragraph(f"Cache state: {text}.", "muted")]
    return []


def image_block(plots: Mapping[str, Path | None], key: str, out_dir: Path) -> list[Block]:
    path = plots.get(key)
    if path is None:
        return []
    return [Image(path.relative_to(out_dir).as_posix(), PLOT_TITLES[key], PLOT_TITLES[key])]


def range_text(row: Mapping[str, Any], column: str, show: str = "duration") -> str:
    return fmt.with_range(
        value(row.get(column)), value(row.get(f"{column}_min")), value(row.get(f"{column}_max")), show
    )


def gap_blocks_about(analysis: Analysis, words: str) -> list[Block]:
    lines = [g.text() for g in analysis.gaps if words in g.what]
    return [Bullets(tuple(lines), "warning")] if lines else []
