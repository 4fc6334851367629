"""The servers' side, from Prometheus: busy slots, KV use, requests processing and deferred over the
load phase with the stages marked (one figure), the histogram cross-check of the exact TTFT
percentiles, and the GPUs' energy per output token and per request (NVML, when there is a GPU)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.chapters.parts import Chapter, Plots, gap_blocks, shown, value
from quantload.analysis.document import Block, Details, Paragraph, Section, Table
from quantload.analysis.gpu_energy import SECTION as GPU_SECTION
from quantload.analysis.gpu_energy import read_gpu_file
from quantload.analysis.interference import EXPERIMENT_WORDS
from quantload.analysis.plotting import Figure, colors, new_figure, save_figure
from quantload.analysis.prometheus_tables import MIN_SCRAPES, QUANTILES, SERVER_SERIES
from quantload.rundir.gpu_file import GpuFile

BAND_SHADES = ("#e3ebf6", "#f3f3f3")
LABEL_CHAR_FRAC = 0.0062  # the share of the panel's width one character of a band label takes
LABEL_GAP_FRAC = 0.01


@dataclass(frozen=True)
class Band:
    """Consecutive stages of one quantization and experiment: one shaded span of the time axis."""

    quant: str
    experiment: str
    start_s: float
    end_s: float
    stages: int

    @property
    def label(self) -> str:
        return f"{self.quant} {EXPERIMENT_WORDS.get(self.experiment, self.experiment.replace('_', ' '))}"


def stage_bands(stages: pd.DataFrame, origin_s: float) -> list[Band]:
    """The stages grouped into bands, in the order they ran."""
    spans = stages.dropna(subset=["started_unix_s", "ended_unix_s"]) if not stages.empty else stages
    bands: list[Band] = []
    for stage in spans.sort_values("started_unix_s").itertuples():
        start, end = float(stage.started_unix_s) - origin_s, float(stage.ended_unix_s) - origin_s
        last = bands[-1] if bands else None
        if last is not None and (last.quant, last.experiment) == (str(stage.quant), str(stage.experiment)):
            bands[-1] = Band(last.quant, last.experiment, last.start_s, max(end, last.end_s), last.stages + 1)
        else:
            bands.append(Band(str(stage.quant), str(stage.experiment), start, end, 1))
    return bands


def _shade_bands(axis: Any, bands: list[Band]) -> None:
    """Each band shaded, alternately, with a thin line where it begins."""
    for index, band in enumerate(bands):
        axis.axvspan(band.start_s, band.end_s, color=BAND_SHADES[index % 2], zorder=0, linewidth=0)
        axis.axvline(band.start_s, color="#9aa3b0", linewidth=0.6, zorder=1)


def _name_bands(axis: Any, bands: list[Band]) -> None:
    """Above the panel, the name of each band whose label fits without touching the one before it
    (placed by the axis's final limits, so call it after plotting)."""
    low, high = axis.get_xlim()
    width = (high - low) or 1.0
    last_end = -1.0
    for band in bands:
        middle = ((band.start_s + band.end_s) / 2 - low) / width
        half = len(band.label) * LABEL_CHAR_FRAC / 2
        if middle - half >= last_end + LABEL_GAP_FRAC and middle + half <= 1.0:
            axis.text(
                (band.start_s + band.end_s) / 2, 1.02, band.label, transform=axis.get_xaxis_transform(),
                ha="center", va="bottom", fontsize=7, color="#333333",
            )  # fmt: skip
            last_end = middle + half


def server_timeseries_figure(analysis: Analysis) -> Any | None:
    """Busy slots, KV use, requests processing and deferred over the load phase: one band per run
    of stages of a quantization and experiment, named above the panels where the name fits; one
    legend, outside the panels."""
    series, stages, quants = analysis.server_series, analysis.stages, analysis.quants
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
    bands = stage_bands(stages, origin)
    figure, axes = new_figure(11.0, 8.4, len(panels), 1, sharex=True)
    palette = colors(quants)
    for row, (metric, label) in enumerate(panels):
        axis = axes[row][0]
        _shade_bands(axis, bands)
        chosen = series[series["metric"] == metric]
        for quant, frame in chosen.groupby("quant", sort=False):
            axis.plot(
                frame["unix_s"] - origin, frame["value"], drawstyle="steps-post", linewidth=1.1,
                color=palette.get(str(quant)), label=str(quant),
            )  # fmt: skip
        if metric == "slots_busy":
            total = series[series["metric"] == "slots"]
            for quant, frame in total.groupby("quant", sort=False):
                axis.plot(
                    frame["unix_s"] - origin, frame["value"], linestyle=":", linewidth=0.9,
                    color=palette.get(str(quant)), label=f"{quant} slots",
                )  # fmt: skip
        axis.set_ylabel(label, fontsize=8)
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.25)
    _name_bands(axes[0][0], bands)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="outside lower center", ncols=min(len(labels), 6), fontsize=8,
                  frameon=False)  # fmt: skip
    axes[-1][0].set_xlabel("seconds since the first load stage (shaded bands: a quantization's experiment)")
    figure.suptitle(
        "Server side, from Prometheus (" + ", ".join(SERVER_SERIES[m][0] for m, _ in panels) + ")"
    )
    return figure


def _server_timeseries(analysis: Analysis, path: Path) -> Path | None:
    figure = server_timeseries_figure(analysis)
    return save_figure(figure, path) if figure is not None else None


SERVER_TIMESERIES = Figure(
    "server_timeseries", "Server-side time series with stage boundaries", _server_timeseries
)


def server_section(analysis: Analysis, plots: Plots) -> Section:
    """Prometheus time series and the histogram cross-check."""
    blocks: list[Block] = []
    if analysis.prometheus_origin:
        blocks.append(Paragraph(f"Read from {analysis.prometheus_origin}.", "muted"))
    blocks += shown(plots, SERVER_TIMESERIES)
    hist = analysis.histogram_check
    if not hist.empty:
        same = [v for q in QUANTILES for v in hist[f"p{round(q * 100)}_same_bucket"] if v is not None]
        partial = int((~hist["comparable"]).sum())
        text = (
            "Prometheus histogram_quantile over each stage's TTFT bucket counts, beside the exact"
            " percentile. A histogram places a quantile only within its bucket, shown as the resolution."
        )
        if same:
            text += (
                " Where a stage lasted a few scrape intervals and the scrapes caught exactly its requests,"
                " the order statistic Prometheus' rule picks lies in the estimate's bucket in"
                f" {sum(bool(v) for v in same)} of {len(same)} cases."
            )
        if partial:
            text += (
                f" {partial} of {fmt.counted(len(hist), 'stage')} are shown but not judged: shorter than"
                f" {MIN_SCRAPES} scrape intervals, or the scrapes caught a different number of requests"
                " than the records hold."
            )
        blocks.append(Paragraph(text))
        rows = []
        for r in hist.to_dict("records"):
            cells = [
                str(r["quant"]),
                str(r["users"]),
                str(r["repeat"]),
                f"{r['records_ok']} / {r['prom_requests']:.0f}",
            ]
            for q in QUANTILES:
                name = f"p{round(q * 100)}"
                low, high = value(r[f"{name}_bucket_low_s"]), value(r[f"{name}_bucket_high_s"])
                bucket = f"({fmt.duration(low)}, {fmt.duration(high)}]" if high is not None else fmt.DASH
                same_bucket = r[f"{name}_same_bucket"]
                cells += [
                    fmt.duration(value(r[f"{name}_exact_s"])),
                    fmt.duration(value(r[f"{name}_prom_s"])),
                    bucket,
                    fmt.DASH if same_bucket is None else ("yes" if same_bucket else "no"),
                ]
            rows.append(tuple(cells))
        columns = (
            "quant",
            "users",
            "repeat",
            "requests records / Prometheus",
            "p50 exact",
            "p50 Prometheus",
            "p50 bucket",
            "same",
            "p99 exact",
            "p99 Prometheus",
            "p99 bucket",
            "same",
        )
        blocks.append(
            Details(
                "TTFT percentiles per stage: exact and from the histogram",
                (
                    Table(
                        columns,
                        tuple(rows),
                        (False, True, True, True, True, True, False, False, True, True, False, False),
                    ),
                ),
            )
        )
    blocks += gap_blocks(analysis, "prometheus")
    return Section("server", "Server side (Prometheus)", tuple(blocks))


def offload_blocks(gpu_file: GpuFile | None) -> list[Block]:
    """Each server's layers on the GPU against `server.gpu_layers`, from its log (gpu.json); nothing
    for a CPU-only llama.cpp that was left to its default (auto) or asked for none."""
    entries = gpu_file.offload.values() if gpu_file is not None else ()
    if not any(entry.get("layers") or entry.get("requested") not in ("auto", "0") for entry in entries):
        return []
    assert gpu_file is not None
    rows = tuple(
        (
            quant,
            str(entry.get("requested", "")),
            f"{entry['offloaded']}/{entry['layers']}" if entry.get("layers") else "none logged",
            ", ".join(str(d.get("name", "")) for d in entry.get("devices", [])) or "-",
            str(entry.get("verdict", "")),
        )
        for quant, entry in gpu_file.offload.items()
    )
    short = [quant for quant, entry in gpu_file.offload.items() if entry.get("verdict") == "fewer than asked"]
    lines = [
        "Layers each server put on the GPU, from its own log (`offloaded N/M layers to GPU`), against"
        " server.gpu_layers."
    ]
    if short:
        lines.append(
            f"{', '.join(short)} offloaded fewer layers than asked: part of those models ran on the CPU,"
            " and their speed and energy are not the GPU's alone."
        )
    return [
        Paragraph(" ".join(lines)),
        Table(("quant", "asked", "offloaded", "devices", "check"), rows, (False,) * 5, name="gpu_offload"),
    ]


def gpu_energy_section(analysis: Analysis) -> Section | None:
    """Each server's layers on the GPU, and energy per output token and per request per
    quantization, or why it is missing."""
    table = analysis.gpu_energy
    notes = gap_blocks(analysis, GPU_SECTION)
    offload = offload_blocks(read_gpu_file(analysis.run.run_dir))
    if table.empty and not notes and not offload:
        return None
    blocks: list[Block] = [*offload]
    if not table.empty:
        blocks.append(
            Paragraph(
                "From the exporter's NVML series: the increase of the energy counter of the GPUs"
                " the quantization's server used (its log's devices, matched to NVML by PCI"
                " address), over its load window (its first request sent to its last one's end,"
                " warm-ups and failures included), divided by the output tokens and the requests of"
                " that window. Other GPUs, idle or serving another file, are not in it. Where the"
                " run measured the GPUs idle before the load, their idle draw over the window is"
                " taken off to give the load's own energy (the last columns)."
            )
        )
        rows = tuple(
            (
                str(r["quant"]),
                fmt.duration(value(r["window_s"])),
                str(r["gpus"]),
                fmt.number(value(r["energy_j"]), 0),
                fmt.number(value(r["mean_power_w"]), 1),
                str(r["requests"]),
                str(r["output_tokens"]),
                fmt.number(value(r["j_per_output_token"]), 3),
                fmt.number(value(r["j_per_request"]), 1),
                fmt.number(value(r.get("idle_power_w")), 1),
                fmt.number(value(r.get("load_j_per_output_token")), 3),
                fmt.number(value(r.get("load_j_per_request")), 1),
                str(r["source"]),
            )
            for r in table.to_dict("records")
        )
        columns = (
            "quant",
            "load window",
            "GPUs",
            "energy (J)",
            "mean power (W)",
            "requests",
            "output tokens",
            "J / output token",
            "J / request",
            "idle power (W)",
            "load's J / output token",
            "load's J / request",
            "from",
        )
        numeric = (False, True, True, True, True, True, True, True, True, True, True, True, False)
        blocks.append(Table(columns, rows, numeric, name="gpu_energy"))
    blocks += notes
    return Section("gpu", "GPU offload and energy (NVML)", tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    energy = gpu_energy_section(analysis)
    return (server_section(analysis, plots), *([energy] if energy is not None else []))


CHAPTER = Chapter(_sections, (SERVER_TIMESERIES,))
