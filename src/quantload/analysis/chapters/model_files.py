"""What each model file is: its quality (perplexity), its speed against this machine's roofline
(one figure), and the memory its KV cache takes (predicted against reported by llama-server)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.chapters.parts import Chapter, Plots, gap_blocks, shown
from quantload.analysis.document import Block, Bullets, Details, Paragraph, Section, Table
from quantload.analysis.plotting import Figure, colors, new_figure, save_figure
from quantload.roofline.speed_file import busy_note


def _quality_speed_size(analysis: Analysis, path: Path) -> Path | None:
    """Perplexity against llama-bench decode tokens/s, marker area by file size."""
    table = analysis.quant_table
    if table.empty:
        return None
    usable = table.dropna(subset=["perplexity", "decode_tok_s"])
    if usable.empty:
        return None
    figure, axes = new_figure(7.5, 4.6)
    axis = axes[0][0]
    palette = colors(analysis.quants)
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
    return save_figure(figure, path)


QUALITY_SPEED_SIZE = Figure(
    "quality_speed_size", "Quality against decode speed and file size", _quality_speed_size
)


def quality_speed_section(analysis: Analysis, plots: Plots) -> Section:
    """Quality details, the quality/speed/size plot and the roofline."""
    blocks: list[Block] = [*shown(plots, QUALITY_SPEED_SIZE)]
    quality = analysis.run.quality
    if quality is not None and quality.results:
        rows = tuple(
            (
                q,
                f"{r.perplexity:.3f} ± {r.perplexity_error:.3f}",
                r.dataset.name,
                str(r.ctx_tokens),
                str(r.chunks_scored),
                f"{r.tokens_scored:,}",
                f"{r.wall_time_s:.1f} s",
            )
            for q, r in quality.results.items()
        )
        blocks.append(
            Table(
                ("quant", "perplexity ± s.e.", "text", "context", "chunks", "tokens scored", "time"),
                rows,
                (False, True, False, True, True, True, True),
            )
        )
    blocks += gap_blocks(analysis, "quality")
    busy = busy_note(analysis.run.speed)
    if busy:
        blocks.append(Paragraph(busy, "warning"))
    roof = analysis.roofline
    if not roof.empty:
        machine = analysis.run.speed.machine if analysis.run.speed else None
        if machine is not None:
            blocks.append(
                Paragraph(
                    f"Machine limits: memory bandwidth {machine.bandwidth_bytes_per_s / 1e9:.1f} GB/s"
                    f" ({machine.bandwidth_method}), arithmetic"
                    f" {machine.arithmetic_flops_per_s / 1e9:.1f} GFLOP/s ({machine.arithmetic_method})."
                )
            )
        roof_rows = tuple(
            (
                str(r["quant"]),
                str(r["test"]),
                fmt.number(r["measured_tok_s"]),
                fmt.number(r["ceiling_tok_s"]),
                str(r["bound"]),
                fmt.percent(r["fraction_of_ceiling"], 0),
                fmt.number(r["memory_ceiling_tok_s"]),
                fmt.number(r["compute_ceiling_tok_s"]),
                f"{r['bits_per_weight']:.2f}",
            )
            for r in roof.to_dict("records")
        )
        columns = (
            "quant",
            "test",
            "measured tok/s",
            "ceiling tok/s",
            "bound",
            "of ceiling",
            "memory ceiling",
            "compute ceiling",
            "bits/weight",
        )
        blocks.append(
            Table(
                columns,
                roof_rows,
                (False, False, True, True, False, True, True, True, True),
                "Roofline from the speed step: the ceiling is the lower of the memory and compute"
                " limits for each test's bytes and FLOPs per token.",
            )
        )
        blocks.append(Bullets(tuple(dict.fromkeys(str(e) for e in roof["explanation"]))))
    blocks += gap_blocks(analysis, "speed")
    return Section("quality_speed", "Quality, speed and the roofline", tuple(blocks))


def kv_section(analysis: Analysis) -> Section:
    """Predicted against reported KV size."""
    rows = tuple(
        (
            k.quant,
            f"{k.slots} × {k.ctx_per_slot}" if k.slots else fmt.DASH,
            k.cache_types or fmt.DASH,
            fmt.number(k.predicted_mib, 2),
            fmt.number(k.reported_mib, 2),
            fmt.percent(k.diff_pct / 100 if k.diff_pct is not None else None, 2, signed=True),
        )
        for k in analysis.kv
    )
    blocks: list[Block] = []
    if rows:
        blocks.append(
            Table(
                ("quant", "slots × ctx", "cache types", "predicted MiB", "reported MiB", "difference"),
                rows,
                (False, True, False, True, True, True),
                "Difference = (predicted − reported) / reported.",
            )
        )
        formulas = tuple(dict.fromkeys(k.formula for k in analysis.kv if k.formula))
        if formulas:
            blocks.append(Details("How the prediction is computed", (Bullets(formulas, "muted"),)))
    blocks += gap_blocks(analysis, "kv")
    return Section("kv", "KV cache: predicted and reported by llama-server", tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return quality_speed_section(analysis, plots), kv_section(analysis)


CHAPTER = Chapter(_sections, (QUALITY_SPEED_SIZE,))
