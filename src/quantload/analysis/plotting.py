"""What every report figure shares: a figure's definition, and matplotlib on its Agg canvas.

A chapter defines its figures (`Figure`: a key, a title, and how it is drawn from the Analysis);
the report draws each one to plots/<key>.png and the chapter places it. A draw function returns
None when the analysis has nothing to draw (the chapter then shows its gap instead). pyplot is
never used: figures are plain `Figure` objects on an Agg canvas, so no global state is touched,
and matplotlib is imported only when a figure is drawn.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

if TYPE_CHECKING:  # annotations only: an experiment's chapter uses these without the whole analysis
    from quantload.analysis.analyze import Analysis

DPI = 110
PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


@dataclass(frozen=True)
class Figure:
    """One PNG of the report: its file stem, its title (alt text and caption), how it is drawn."""

    key: str
    title: str
    draw: Callable[[Analysis, Path], Path | None]


def new_figure(
    width_in: float, height_in: float, rows: int = 1, cols: int = 1, **kwargs: Any
) -> tuple[Any, Any]:
    """A matplotlib Figure on an Agg canvas and its grid of axes (always 2-D)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure as MatplotlibFigure

    figure = MatplotlibFigure(figsize=(width_in, height_in), dpi=DPI, layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(rows, cols, squeeze=False, **kwargs)
    return figure, axes


def save_figure(figure: Any, path: Path) -> Path:
    """Write the figure as PNG; returns `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=DPI)
    return path


def colors(quants: Sequence[str]) -> dict[str, str]:
    """One colour per quantization, in the run's order: the eight of PALETTE, and for more files
    matplotlib's 20-colour tab20 so no two files share one (up to 20)."""
    if len(quants) <= len(PALETTE):
        return {quant: PALETTE[index] for index, quant in enumerate(quants)}
    from matplotlib import colormaps
    from matplotlib.colors import to_hex

    many = [to_hex(color) for color in colormaps["tab20"].colors]  # type: ignore[attr-defined]
    return {quant: many[index % len(many)] for index, quant in enumerate(quants)}


def column_values(frame: pd.DataFrame, name: str) -> list[float]:
    """A column as floats, NaN where missing."""
    return [float("nan") if v is None or pd.isna(v) else float(v) for v in frame[name]]


def error_bars(frame: pd.DataFrame, metric: str, scale: float = 1.0) -> list[list[float]]:
    """[below, above] distances from a level table's median to its _min and _max (matplotlib yerr)."""
    mid = column_values(frame, metric)
    low, high = column_values(frame, f"{metric}_min"), column_values(frame, f"{metric}_max")
    below = [
        max(0.0, (m - lo) * scale) if not math.isnan(lo) else 0.0 for m, lo in zip(mid, low, strict=True)
    ]
    above = [
        max(0.0, (hi - m) * scale) if not math.isnan(hi) else 0.0 for m, hi in zip(mid, high, strict=True)
    ]
    return [below, above]


def interval_bars(
    frame: pd.DataFrame, metric: str, scale: float = 1.0
) -> tuple[list[list[float]], list[bool]]:
    """[below, above] distances from a level's pooled percentile to its confidence interval
    (`<metric>_ci`), and per level whether the requests could not bound it above; a table without
    intervals gives its repeats' min and max instead (and nothing unbounded)."""
    if f"{metric}_ci" not in frame:
        return error_bars(frame, metric, scale), [False] * len(frame)
    mid = column_values(frame, metric)
    below: list[float] = []
    above: list[float] = []
    unbounded: list[bool] = []
    for m, interval in zip(mid, frame[f"{metric}_ci"], strict=True):
        low, high = interval if isinstance(interval, (tuple, list)) and len(interval) == 2 else (None, None)
        if math.isnan(m):
            below.append(0.0)
            above.append(0.0)
            unbounded.append(False)
            continue
        below.append(max(0.0, (m - low) * scale) if low is not None else 0.0)
        above.append(max(0.0, (high - m) * scale) if high is not None else 0.0)
        unbounded.append(high is None)
    return [below, above], unbounded


def users_axis(axis: Any, users: Sequence[int]) -> None:
    """A log2 x axis ticked at the concurrency levels."""
    axis.set_xscale("log", base=2)
    axis.set_xticks(list(users), [str(u) for u in users])
    axis.minorticks_off()
    axis.set_xlabel("concurrent users")
    axis.grid(True, alpha=0.3)


def log_scale_if_wide(axis: Any, values: Sequence[float]) -> None:
    """A log y axis when the positive values span more than a factor of 30."""
    finite = [v for v in values if v > 0 and math.isfinite(v)]
    if finite and max(finite) / min(finite) > 30:
        axis.set_yscale("log")
