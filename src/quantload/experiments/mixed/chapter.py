"""The mixed experiment's chapter. Mixed traffic (two figures and a one-sentence verdict): decode
inter-token gaps alone and with long prompts mixed in, per batch size; busy slots, KV use and
deferred requests over the mixed stages (from Prometheus)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantload.analysis import fmt
from quantload.analysis.chapters.parts import Chapter, Plots, not_run_section, shown, value
from quantload.analysis.document import Block, Paragraph, Section, Table
from quantload.analysis.plotting import Figure, colors, new_figure, save_figure
from quantload.experiments.mixed.findings import findings_of
from quantload.experiments.mixed.stages import NAME

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


def _mixed_itl(analysis: Analysis, path: Path) -> Path | None:
    """Decode ITL p95 and p99, alone and with long prompts, per batch size and quantization."""
    table = findings_of(analysis).table
    if table.empty or table["itl_p99_s"].dropna().empty:
        return None
    groups = list(dict.fromkeys(zip(table["quant"], table["server_args"], strict=True)))
    figure, axes = new_figure(max(6.0, 2.2 * len(groups)), 4.2)
    axis = axes[0][0]
    width = 0.2
    for index, (quant, args) in enumerate(groups):
        rows = table[(table["quant"] == quant) & (table["server_args"] == args)]
        for offset, (phase, metric, color) in enumerate(
            (
                ("alone", "itl_p95_s", "#9ecae1"),
                ("alone", "itl_p99_s", "#3182bd"),
                ("mixed", "itl_p95_s", "#fdae6b"),
                ("mixed", "itl_p99_s", "#e6550d"),
            )
        ):
            found = rows[rows["phase"] == phase][metric].dropna()
            if found.empty:
                continue
            label = f"{phase} {metric[4:7]}" if index == 0 else None
            axis.bar(
                index + (offset - 1.5) * width, float(found.iloc[0]) * 1000, width, color=color, label=label
            )
    axis.set_xticks(range(len(groups)), [f"{quant}\n{args}" for quant, args in groups], fontsize=8)
    axis.set_ylabel("decode inter-token gap (ms)")
    axis.set_yscale("log")
    axis.grid(True, axis="y", alpha=0.3)
    axis.legend(fontsize=8)
    axis.set_title("Decode-heavy requests: ITL alone and with long prompts mixed in")
    return save_figure(figure, path)


def _short_batch(args: object) -> str:
    parts = str(args).split()
    return f"b{parts[1]}" if len(parts) > 1 and parts[0] == "-b" else str(args)


def _mixed_timeline(analysis: Analysis, path: Path) -> Path | None:
    """Busy slots, KV cells used and requests deferred over each quantization's mixed stages."""
    series, stages = analysis.server_series, analysis.stages
    if series.empty or stages.empty:
        return None
    mixed = stages[(stages["experiment"] == NAME)].dropna(subset=["started_unix_s", "ended_unix_s"])
    quants = [q for q in analysis.quants if (mixed["quant"] == q).any()]
    if not quants:
        return None
    panels = [("slots_busy", "busy slots"), ("kv_used_ratio", "KV cells used\n(fraction)"),
              ("requests_deferred", "requests\ndeferred")]  # fmt: skip
    figure, axes = new_figure(4.2 * len(quants), 6.4, len(panels), len(quants), sharey="row")
    palette = colors(analysis.quants)
    drawn = False
    for column, quant in enumerate(quants):
        mine = mixed[mixed["quant"] == quant]
        start, end = float(mine["started_unix_s"].min()), float(mine["ended_unix_s"].max())
        inside = (series["unix_s"] >= start - 2) & (series["unix_s"] <= end + 2)
        window = series[(series["quant"] == quant) & inside]
        for row, (metric, label) in enumerate(panels):
            axis = axes[row][column]
            for stage in mine.itertuples():
                shade = "#fde0c5" if stage.phase == "mixed" else "#deebf7"
                left, right = stage.started_unix_s - start, stage.ended_unix_s - start
                axis.axvspan(left, right, color=shade, zorder=0, linewidth=0)
                if row == 0 and (right - left) > 0.06 * max(end - start, 1.0):
                    axis.text(
                        (left + right) / 2, 1.01, f"{stage.phase}\n{_short_batch(stage.server_args)}",
                        transform=axis.get_xaxis_transform(), ha="center", va="bottom", fontsize=6,
                    )  # fmt: skip
            frame = window[window["metric"] == metric]
            if not frame.empty:
                drawn = True
                axis.plot(frame["unix_s"] - start, frame["value"], color=palette.get(quant))
            axis.grid(True, alpha=0.3)
            if column == 0:
                axis.set_ylabel(label, fontsize=8)
        axes[0][column].set_title(quant, fontsize=9, pad=18)
        axes[-1][column].set_xlabel("s from its first mixed stage")
    if not drawn:
        return None
    figure.suptitle("During the mixed stages (blue: decode alone, orange: long prompts mixed in)")
    return save_figure(figure, path)


FIGURES = (
    Figure("mixed_itl", "Decode ITL alone and with long prompts", _mixed_itl),
    Figure(
        "mixed_timeline", "Busy slots, KV use and deferred requests during the mixed stages", _mixed_timeline
    ),
)


def mixed_section(analysis: Analysis, plots: Plots) -> Section:
    """The mixed-traffic diagnosis: decode ITL with and without long prompts, per batch size."""
    table = findings_of(analysis).table
    title = "Mixed traffic: long prompts against everyone's decode"
    if table.empty:
        return not_run_section("mixed", title, "no complete mixed-traffic stage (the mixed experiment)")
    blocks: list[Block] = [
        Paragraph(
            "Decode-heavy requests (a short prompt, a long answer) first alone, then the same requests"
            " with long prompts mixed in. Every server step decodes one token for each running request"
            " and then takes up to -b prompt tokens of waiting prompts (llama.cpp's chunked prefill), so"
            " a long prompt stretches the steps of everyone decoding beside it; a smaller -b/-ub spreads"
            " it over more, shorter steps. ITL pools every gap of every decode-heavy request."
        ),
        Paragraph(findings_of(analysis).verdict, "verdict"),
    ]
    rows = tuple(
        (
            str(r["quant"]),
            str(r["server_args"]),
            str(r["phase"]),
            f"{r['decode_requests']} + {r['long_requests']}",
            fmt.duration(value(r["itl_p50_s"])),
            fmt.duration(value(r["itl_p95_s"])),
            fmt.duration(value(r["itl_p99_s"])),
            fmt.duration(value(r["tpot_p50_s"])),
            fmt.duration(value(r["tpot_p99_s"])),
            fmt.duration(value(r["decode_ttft_p50_s"])),
            fmt.duration(value(r["long_ttft_p50_s"])),
        )
        for r in table.to_dict("records")
    )
    columns = (
        *("quant", "batch", "phase", "decode + long", "ITL p50", "ITL p95", "ITL p99"),
        *("TPOT p50", "TPOT p99", "decode TTFT p50", "long-prompt TTFT p50"),
    )
    blocks.append(
        Table(columns, rows, (False, False, False, *([True] * 8)), "Decode-heavy requests' figures")
    )
    blocks += [block for figure in FIGURES for block in shown(plots, figure)]
    if plots.get("mixed_timeline") is None:
        blocks.append(
            Paragraph(
                "not measured: busy slots, KV use and deferred requests over time need Prometheus"
                f" ({analysis.prometheus_origin or 'none was available to the report'})",
                "warning",
            )
        )
    return Section("mixed", title, tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return (mixed_section(analysis, plots),)


CHAPTER = Chapter(_sections, FIGURES)
