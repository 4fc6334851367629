"""The report's figures as PNG files, drawn with matplotlib's Agg canvas.

Each function draws one figure from the analysis tables and returns its path, or None when the
table has nothing to draw (the report then shows the section's gap instead). pyplot is never
used: figures are plain `Figure` objects on an Agg canvas, so no global state is touched.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from quantload.analysis.server_series import SERVER_SERIES
from quantload.config import ReportSettings

DPI = 110
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


def _figure(
    width_in: float, height_in: float, rows: int = 1, cols: int = 1, **kwargs: Any
) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, cols, squeeze=False, **kwargs)
    return figure, axes


def _save(figure: Any, path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=DPI)
    return path


def colors(quants: Sequence[str]) -> dict[str, str]:
    """One stable colour per quantization, in the run's order."""
    return {quant: PALETTE[index % len(PALETTE)] for index, quant in enumerate(quants)}


def _column(frame: pd.DataFrame, name: str) -> list[float]:
    return [float("nan") if v is None or pd.isna(v) else float(v) for v in frame[name]]


def _errors(frame: pd.DataFrame, metric: str, scale: float = 1.0) -> list[list[float]]:
    mid, low, high = _column(frame, metric), _column(frame, f"{metric}_min"), _column(frame, f"{metric}_max")
    below = [
        max(0.0, (m - lo) * scale) if not math.isnan(lo) else 0.0 for m, lo in zip(mid, low, strict=True)
    ]
    above = [
        max(0.0, (hi - m) * scale) if not math.isnan(hi) else 0.0 for m, hi in zip(mid, high, strict=True)
    ]
    return [below, above]


def _users_axis(axis: Any, users: Sequence[int]) -> None:
    axis.set_xscale("log", base=2)
    axis.set_xticks(list(users), [str(u) for u in users])
    axis.minorticks_off()
    axis.set_xlabel("concurrent users")
    axis.grid(True, alpha=0.3)


def _maybe_log(axis: Any, values: Sequence[float]) -> None:
    finite = [v for v in values if v > 0 and math.isfinite(v)]
    if finite and max(finite) / min(finite) > 30:
        axis.set_yscale("log")


def ttft_vs_concurrency(
    levels: pd.DataFrame, quants: Sequence[str], slo: ReportSettings, path: Path
) -> Path | None:
    """TTFT p50 (solid) and p99 (dashed) against users, per quant, min-max of repeats as bars."""
    if levels.empty or levels["ttft_p50_s"].dropna().empty:
        return None
    figure, axes = _figure(8.0, 4.6)
    axis = axes[0][0]
    palette = colors(quants)
    shown: list[float] = []
    for quant, frame in levels.groupby("quant", sort=False):
        users = [int(u) for u in frame["users"]]
        for metric, style, label in (("ttft_p50_s", "-o", "p50"), ("ttft_p99_s", "--s", "p99")):
            values = [v * 1000 for v in _column(frame, metric)]
            shown += values
            axis.errorbar(
                users,
                values,
                yerr=_errors(frame, metric, 1000),
                fmt=style,
                capsize=3,
                color=palette.get(str(quant)),
                label=f"{quant} {label}",
            )
    axis.axhline(
        slo.slo_ttft_p99_s * 1000,
        color="black",
        linestyle=":",
        linewidth=1,
        label=f"SLO p99 {slo.slo_ttft_p99_s * 1000:g} ms",
    )
    _users_axis(axis, sorted({int(u) for u in levels["users"]}))
    _maybe_log(axis, shown)
    axis.set_ylabel("TTFT (ms)")
    axis.set_title("Time to first token against concurrency (median of repeats, bars: min–max)")
    axis.legend(fontsize=8, ncols=2)
    return _save(figure, path)


def throughput_vs_concurrency(levels: pd.DataFrame, quants: Sequence[str], path: Path) -> Path | None:
    """Total output tokens/s against users, per quant."""
    if levels.empty or levels["output_tok_s"].dropna().empty:
        return None
    figure, axes = _figure(8.0, 4.2)
    axis = axes[0][0]
    palette = colors(quants)
    for quant, frame in levels.groupby("quant", sort=False):
        axis.errorbar(
            [int(u) for u in frame["users"]],
            _column(frame, "output_tok_s"),
            yerr=_errors(frame, "output_tok_s"),
            fmt="-o",
            capsize=3,
            color=palette.get(str(quant)),
            label=str(quant),
        )
    _users_axis(axis, sorted({int(u) for u in levels["users"]}))
    axis.set_ylabel("output tokens/s (all users)")
    axis.set_ylim(bottom=0)
    axis.set_title("Throughput against concurrency (median of repeats, bars: min–max)")
    axis.legend(fontsize=8)
    return _save(figure, path)


def latency_vs_throughput(
    levels: pd.DataFrame, quants: Sequence[str], slo: ReportSettings, path: Path
) -> Path | None:
    """TTFT p99 and TPOT p99 against output tokens/s: one curve per quant, points labelled by users."""
    if levels.empty or levels["output_tok_s"].dropna().empty:
        return None
    figure, axes = _figure(10.0, 4.4, 1, 2)
    palette = colors(quants)
    for axis, metric, limit, title in (
        (axes[0][0], "ttft_p99_s", slo.slo_ttft_p99_s, "TTFT p99 (ms)"),
        (axes[0][1], "tpot_p99_s", slo.slo_tpot_s, "TPOT p99 (ms)"),
    ):
        for quant, frame in levels.groupby("quant", sort=False):
            x, y = _column(frame, "output_tok_s"), [v * 1000 for v in _column(frame, metric)]
            axis.plot(x, y, "-o", color=palette.get(str(quant)), label=str(quant))
            for xi, yi, users in zip(x, y, frame["users"], strict=True):
                if math.isfinite(xi) and math.isfinite(yi):
                    axis.annotate(
                        f"{int(users)}u", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7
                    )
        axis.axhline(limit * 1000, color="black", linestyle=":", linewidth=1, label="SLO")
        axis.set_xlabel("output tokens/s (all users)")
        axis.set_ylabel(title)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle("Latency against throughput (one curve per quantization; labels: concurrent users)")
    return _save(figure, path)


def quality_speed_size(seed: pd.DataFrame, quants: Sequence[str], path: Path) -> Path | None:
    """Perplexity against llama-bench decode tokens/s, marker area by file size."""
    if seed.empty:
        return None
    usable = seed.dropna(subset=["perplexity", "decode_tok_s"])
    if usable.empty:
        return None
    figure, axes = _figure(7.5, 4.6)
    axis = axes[0][0]
    palette = colors(quants)
    sizes = [
        float(s) if s is not None and not pd.isna(s) else float("nan") for s in usable["file_size_bytes"]
    ]
    largest = max((s for s in sizes if math.isfinite(s)), default=1.0)
    for row, size in zip(usable.to_dict("records"), sizes, strict=True):
        area = 80 + 900 * (size / largest) if math.isfinite(size) else 80
        axis.errorbar(
            [row["decode_tok_s"]],
            [row["perplexity"]],
            yerr=[[row["perplexity_error"] or 0.0]] * 2,
            fmt="none",
            ecolor="gray",
            capsize=3,
        )
        axis.scatter(
            [row["decode_tok_s"]],
            [row["perplexity"]],
            s=area,
            alpha=0.55,
            color=palette.get(str(row["quant"])),
            edgecolors="black",
            linewidths=0.5,
        )
        label = f"{row['quant']}\n{size / 2**20:,.1f} MiB" if math.isfinite(size) else str(row["quant"])
        axis.annotate(
            label,
            (row["decode_tok_s"], row["perplexity"]),
            textcoords="offset points",
            xytext=(10, 6),
            fontsize=8,
        )
    axis.set_xlabel("decode tokens/s (llama-bench, one stream)")
    axis.set_ylabel("perplexity (lower is better; bars: ±1 s.e.)")
    axis.set_title("Quality against decode speed; marker area ∝ file size")
    axis.grid(True, alpha=0.3)
    axis.margins(0.25)
    return _save(figure, path)


def _stage_marks(axis: Any, stages: pd.DataFrame, origin_s: float, label: bool) -> None:
    spans = stages.dropna(subset=["started_unix_s", "ended_unix_s"])
    if spans.empty:
        return
    total = float(spans["ended_unix_s"].max() - spans["started_unix_s"].min()) or 1.0
    for index, stage in enumerate(spans.itertuples()):
        start, end = stage.started_unix_s - origin_s, stage.ended_unix_s - origin_s
        shade = "#dfe8f5" if stage.experiment == "prefix_cache" else ("#eeeeee" if index % 2 else "#f7f7f7")
        axis.axvspan(start, end, color=shade, zorder=0, linewidth=0)
        axis.axvline(start, color="#888888", linewidth=0.6, zorder=1)
        if label and (end - start) / total > 0.015:
            text = (
                f"{'on' if stage.cache_prompt else 'off'}"
                if stage.experiment == "prefix_cache"
                else f"{int(stage.users)}u"
                if pd.notna(stage.users)
                else ""
            )
            axis.text(
                (start + end) / 2,
                1.01,
                text,
                transform=axis.get_xaxis_transform(),
                ha="center",
                va="bottom",
                fontsize=6,
                color="#444444",
            )


def server_timeseries(
    series: pd.DataFrame, stages: pd.DataFrame, quants: Sequence[str], path: Path
) -> Path | None:
    """Busy slots, KV use, requests processing and deferred over the load phase, stages marked."""
    if series.empty:
        return None
    panels = [
        ("slots_busy", "busy slots"),
        ("kv_used_ratio", "KV cells used\n(fraction)"),
        ("requests_processing", "requests\nprocessing"),
        ("requests_deferred", "requests\ndeferred"),
    ]
    starts = stages["started_unix_s"].dropna() if not stages.empty else pd.Series(dtype=float)
    origin = float(starts.min()) if len(starts) else float(series["unix_s"].min())
    figure, axes = _figure(11.0, 8.0, len(panels), 1, sharex=True)
    palette = colors(quants)
    for row, (metric, label) in enumerate(panels):
        axis = axes[row][0]
        _stage_marks(axis, stages, origin, label=row == 0)
        chosen = series[series["metric"] == metric]
        for quant, frame in chosen.groupby("quant", sort=False):
            axis.plot(
                frame["unix_s"] - origin,
                frame["value"],
                drawstyle="steps-post",
                linewidth=1.1,
                color=palette.get(str(quant)),
                label=str(quant),
            )
        if metric == "slots_busy":
            total = series[series["metric"] == "slots"]
            for quant, frame in total.groupby("quant", sort=False):
                axis.plot(
                    frame["unix_s"] - origin,
                    frame["value"],
                    linestyle=":",
                    linewidth=0.9,
                    color=palette.get(str(quant)),
                    label=f"{quant} slots",
                )
        axis.set_ylabel(label, fontsize=8)
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.25)
        if row == 0:
            axis.legend(fontsize=7, ncols=max(1, len(quants)), loc="upper left")
    axes[-1][0].set_xlabel("seconds since the first load stage (shaded: stages; labels: users, cache off/on)")
    figure.suptitle(
        "Server side, from Prometheus (" + ", ".join(SERVER_SERIES[m][0] for m, _ in panels) + ")"
    )
    return _save(figure, path)
