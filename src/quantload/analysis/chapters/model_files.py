"""What each model file is: its quality loss against F16 (KL divergence, a sentence per
quantization), its quality and speed against this machine's roofline (one figure: quality loss
against decode speed and file size), what a mixture of experts' token reads (quantload.analysis.
moe_section), and the memory its KV cache takes (predicted against reported by llama-server).
The KV-cache type trade-off, which closes the chapter, is the kv_types experiment's own
(experiments/kv_types/chapter.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.chapters.parts import Chapter, Plots, gap_blocks, gap_blocks_about, shown, value
from quantload.analysis.document import Block, Bullets, Details, Paragraph, Section, Table
from quantload.analysis.imatrix_pairs import imatrix_pair_table
from quantload.analysis.moe_section import moe_section
from quantload.analysis.plotting import Figure, colors, new_figure, save_figure
from quantload.analysis.quality_loss import KLD_DIGITS, nats_shown
from quantload.cpu_share import BUSY_OTHER_CPU_FRAC
from quantload.roofline.speed_file import busy_note


def _quality_axis(table: pd.DataFrame) -> tuple[str, str, str, str] | None:
    """(value column, error column, axis label, unit) of the quality the plot shows: the mean KLD
    from F16 where it was measured, else perplexity; None when there is neither."""
    if "kld_mean_nats" in table and table["kld_mean_nats"].notna().any():
        label = "mean KLD from F16, nats (lower is better; bars: ±1 s.e.)"
        return "kld_mean_nats", "kld_mean_error_nats", label, "nats"
    if table["perplexity"].notna().any():
        return "perplexity", "perplexity_error", "perplexity (lower is better; bars: ±1 s.e.)", ""
    return None


def quality_speed_figure(analysis: Analysis) -> Any | None:
    """Quality loss (mean KLD from F16, else perplexity) against llama-bench decode tokens/s and
    against file size: the trade-off a quantization is chosen on. Each point with its interval (±1
    standard error); a KLD is never drawn below the floor (F16 against its own base, at least 0:
    a divergence is never negative), and the floor is drawn and named."""
    table = analysis.quant_table
    if table.empty:
        return None
    axis_of = _quality_axis(table)
    if axis_of is None:
        return None
    quality, error, label, unit = axis_of
    usable = table.dropna(subset=[quality])
    figure, axes = new_figure(11.0, 4.6, 1, 2, sharey=True)
    palette = colors(analysis.quants)
    is_kld = quality == "kld_mean_nats"
    floor = max(0.0, analysis.quality_loss.floor_kld_mean_nats or 0.0) if is_kld else None
    panels = (
        (axes[0][0], "decode_tok_s", 1.0, "decode tokens/s (llama-bench, one stream)"),
        (axes[0][1], "file_size_bytes", 1 / 2**20, "file size, MiB"),
    )
    top = 0.0
    for axis, column, scale, xlabel in panels:
        rows = usable.dropna(subset=[column]).to_dict("records")
        for row in rows:
            x, measured = float(row[column]) * scale, float(row[quality])
            y = max(measured, floor) if floor is not None else measured
            spread = float(row[error]) if row.get(error) is not None and not pd.isna(row[error]) else 0.0
            below = min(spread, y - floor) if floor is not None else spread
            axis.errorbar([x], [y], yerr=[[below], [spread]], fmt="none", ecolor="gray", capsize=3)
            axis.scatter([x], [y], s=120, alpha=0.75, color=palette.get(str(row["quant"])),
                         edgecolors="black", linewidths=0.5, clip_on=False, zorder=3)  # fmt: skip
            shown_y = nats_shown(y) if is_kld else f"{y:.3f}"
            axis.annotate(f"{row['quant']}\n{shown_y} {unit}".rstrip(), (x, y), textcoords="offset points",
                          xytext=(8, 6), fontsize=8)  # fmt: skip
            top = max(top, y + spread)
        if floor is not None:
            axis.axhline(floor, color="gray", linestyle="--", linewidth=1.0, zorder=2,
                         label=f"floor: F16 against its own base ({nats_shown(floor)} nats)")  # fmt: skip
        axis.set_xlabel(xlabel)
        axis.grid(True, alpha=0.3)
        axis.margins(0.25)
    if floor is not None:  # nothing below the floor: the axis starts there, and the floor is named
        axes[0][0].set_ylim(floor, top + 0.25 * ((top - floor) or 1e-6))
        handles, labels = axes[0][0].get_legend_handles_labels()
        figure.legend(handles, labels, loc="outside lower center", fontsize=8, frameon=False)
    axes[0][0].set_ylabel(label)
    what = "Quality loss" if is_kld else "Perplexity"
    figure.suptitle(f"{what} against decode speed and against file size")
    return figure


def _quality_speed_size(analysis: Analysis, path: Path) -> Path | None:
    figure = quality_speed_figure(analysis)
    return save_figure(figure, path) if figure is not None else None


QUALITY_SPEED_SIZE = Figure(
    "quality_speed_size", "Quality loss against decode speed and file size", _quality_speed_size
)


def _of_ceiling(fraction: float | None) -> str:
    """A measured rate's share of its ceiling; above the ceiling, flagged instead of a share over
    100 %: the ceiling is what is wrong."""
    if fraction is None:
        return fmt.DASH
    return "above it ⚠" if fraction > 1.0 else fmt.percent(fraction, 0)


def roofline_flags(analysis: Analysis) -> list[Block]:
    """Warnings that the roofline's ceilings cannot be read as ceilings: one moved between probes
    by more than its noise, or a measured rate went above its ceiling."""
    lines = []
    speed = analysis.run.speed
    if speed is not None and speed.machine is not None:
        lines += [f"Unsure ceiling: {move}." for move in speed.machine.moves()]
    roof = analysis.roofline
    for row in roof.to_dict("records") if not roof.empty else []:
        fraction = value(row.get("fraction_of_ceiling"))
        if fraction is not None and fraction > 1.0:
            lines.append(
                f"{row['quant']} {row['test']} ran at {fmt.number(value(row['measured_tok_s']))} tok/s,"
                f" above its {row['bound']} ceiling of {fmt.number(value(row['ceiling_tok_s']))} tok/s"
                f" ({fmt.percent(fraction, 0)}): a rate cannot beat a true ceiling, so this ceiling is wrong"
                " here (the probe ran slower than the kernels can, e.g. beside other work, or an int8 kernel"
                " outruns the f32 probe); rerun `quantload speed --reprobe` on a quiet machine."
            )
    return [Bullets(tuple(lines), "warning")] if lines else []


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
    settings = analysis.run.settings
    threshold = settings.load.interference_cpu_frac if settings is not None else BUSY_OTHER_CPU_FRAC
    busy = busy_note(analysis.run.speed, threshold)
    if busy:
        blocks.append(Paragraph(busy, "warning"))
    roof = analysis.roofline
    blocks += roofline_flags(analysis)
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
        speed_file = analysis.run.speed
        if speed_file is not None and speed_file.gpus and (roof["device"] != "cpu").any():
            blocks.append(Paragraph(" ".join(
                f"GPU {g.name}: memory bandwidth {g.bandwidth_bytes_per_s / 1e9:,.0f} GB/s"
                f" ({g.bandwidth_source}), arithmetic {g.arithmetic_flops_per_s / 1e12:,.0f} TFLOP/s"
                f" ({g.arithmetic_source})."
                for g in speed_file.gpus
            ) + " Each test is set against the device it ran on (column device)."))
        roof_rows = tuple(
            (
                str(r["quant"]),
                str(r["test"]),
                fmt.number(r["measured_tok_s"]),
                fmt.number(r["ceiling_tok_s"]),
                str(r["bound"]),
                _of_ceiling(value(r["fraction_of_ceiling"])),
                fmt.number(r["memory_ceiling_tok_s"]),
                fmt.number(r["compute_ceiling_tok_s"]),
                f"{r['bits_per_weight']:.2f}",
                str(r.get("device", "cpu")),
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
            "device",
        )
        blocks.append(
            Table(
                columns,
                roof_rows,
                (False, False, True, True, False, True, True, True, True, False),
                "Roofline from the speed step: the ceiling is the lower of the memory and compute"
                " limits for each test's bytes and FLOPs per token.",
            )
        )
        blocks.append(Bullets(tuple(dict.fromkeys(str(e) for e in roof["explanation"]))))
    speeds = analysis.run.speed
    for quant, entry in (speeds.results.items() if speeds is not None else ()):
        if entry.roofline is None:
            blocks.append(Paragraph(f"No roofline for {quant}: {entry.roofline_missing}.", "warning"))
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


def pct_with_error(number: float | None, error: float | None = None, signed: bool = False) -> str:
    """A percentage with its ± error (the KV-cache type chapter shows them alike)."""
    if number is None:
        return fmt.DASH
    text = f"{number:+.2f}" if signed else f"{number:.2f}"
    return f"{text} ± {error:.2f} %" if error is not None else f"{text} %"


def quality_loss_section(analysis: Analysis) -> Section:
    """How far each quantization is from F16: a sentence each, the floor, and the details."""
    loss = analysis.quality_loss
    blocks: list[Block] = []
    if loss.reference:
        blocks.append(Paragraph(loss.reference, "muted"))
    if loss.sentences:
        blocks.append(Bullets(loss.sentences, "verdict"))
    rows = tuple(
        (
            str(r["quant"]) + (" (floor)" if r["is_floor"] else ""),
            str(r["cache_type"]),
            kld_with_error(value(r["kld_mean_nats"]), value(r["kld_mean_error_nats"])),
            _nats(value(r["kld_median_nats"]), KLD_DIGITS),
            _nats(value(r["kld_p99_nats"]), 5),
            _nats(value(r["kld_p99_9_nats"]), 5),
            pct_with_error(value(r["same_top_p_pct"]), value(r["same_top_p_error_pct"])),
            pct_with_error(value(r["delta_p_rms_pct"])),
            pct_with_error(value(r["ppl_change_pct"]), value(r["ppl_change_error_pct"]), signed=True),
            str(r["chunks_scored"]),
        )
        for r in loss.rows.to_dict("records")
    )
    if rows:
        blocks.append(
            Table(
                ("quant", "KV cache", "mean KLD ± s.e. (nats)", "median", "p99", "p99.9", "same top token",
                 "RMS Δp", "Δ perplexity", "chunks"),
                rows,
                (False, False, True, True, True, True, True, True, True, True),
                "KL divergence of each file's next-token distribution from F16's, paired per token"
                " (llama-perplexity). ± is the larger of llama-perplexity's per-token standard error"
                " (which treats tokens as independent and understates it) and the spread of the"
                " chunks' own means; two values differ beyond the uncertainty when they are more than"
                " two combined standard errors apart. Δ perplexity is against F16's own perplexity on"
                " the same tokens. Rows with another KV cache type measure weights and cache together.",
            )
        )
    elif loss.missing:
        blocks.append(Paragraph(f"not measured: quality loss against F16: {loss.missing}", "warning"))
    manifest = analysis.run.manifest
    if manifest is not None and manifest.files and manifest.reference_label() is None:
        blocks.append(
            Paragraph(
                "Perplexity only: none of the run's files is F16, BF16 or F32, so there is no reference"
                " to measure KL divergence against (give one with prepare.reference, --reference).",
                "warning",
            )
        )
    blocks += imatrix_pair_blocks(analysis)
    blocks += gap_blocks_about(analysis, "KL divergence")
    kld = analysis.run.quality.kld if analysis.run.quality is not None else None
    against = kld.base.quant if kld is not None else "the reference"
    return Section("quality_loss", f"Quality loss against {against} (KL divergence)", tuple(blocks))


def imatrix_pair_blocks(analysis: Analysis) -> list[Block]:
    """The same type with and without an importance matrix, as row pairs."""
    table = imatrix_pair_table(analysis.run, analysis.quants)
    if table.empty:
        return []
    rows = tuple(
        (
            str(r["quant"]),
            str(r["imatrix"] or fmt.DASH),
            fmt.mib(value(r["size_bytes"])),
            kld_with_error(value(r["kld_mean_nats"]), value(r["kld_mean_error_nats"])),
            pct_with_error(value(r["same_top_p_pct"])),
            fmt.DASH if value(r["perplexity"]) is None
            else f"{value(r['perplexity']):.3f} ± {value(r['perplexity_error']) or 0:.3f}",
            fmt.percent(value(r["kld_change_frac"]), 1, signed=True),
            fmt.DASH if r["beyond_uncertainty"] is None else ("yes" if r["beyond_uncertainty"] else "no"),
        )
        for r in table.to_dict("records")
    )
    return [
        Table(
            ("quant", "importance matrix", "size", "mean KLD ± s.e. (nats)", "same top token",
             "perplexity ± s.e.", "KLD change", "beyond uncertainty"),
            rows,
            (False, False, True, True, True, True, True, False),
            "The importance matrix's effect: each type measured without and with one (row pairs; the"
            " matrix is read from each file's own quantize.imatrix.* metadata). KLD change is the"
            " with-row's mean KLD against the without-row's; beyond uncertainty = more than two combined"
            " standard errors apart.",
            "imatrix-pairs",
        )
    ]


def _nats(number: float | None, digits: int) -> str:
    """A divergence: never shown below zero (llama-perplexity's rounding can print -0.000001)."""
    return fmt.number(None if number is None else max(0.0, number), digits)


def kld_with_error(number: float | None, error: float | None) -> str:
    """A divergence with its ± standard error."""
    if number is None:
        return fmt.DASH
    text = _nats(number, KLD_DIGITS)
    return f"{text} ± {fmt.number(error, KLD_DIGITS)}" if error is not None else text


def _sensitivity_plot(analysis: Analysis, path: Path) -> Path | None:
    """KLD per MiB of every tensor group: what raising it buys, what lowering it costs."""
    scan = analysis.run.sensitivity
    if scan is None or not scan.variants:
        return None
    directions: list[Literal["raise", "lower"]] = [d for d in ("raise", "lower") if scan.ranking(d)]
    figure, axes = new_figure(5.5 * len(directions), 4.2, 1, len(directions))
    titles = {
        "raise": f"raised to {scan.raise_to}: nats of KLD removed per MiB added",
        "lower": f"lowered to {scan.lower_to}: nats of KLD added per MiB saved",
    }
    for axis, direction in zip(axes[0], directions, strict=True):
        ranked = scan.ranking(direction)
        axis.barh([str(v.group) for v in ranked][::-1], [v.kld_per_mib or 0.0 for v in ranked][::-1],
                  color="#1f77b4" if direction == "raise" else "#d62728")  # fmt: skip
        axis.set_title(titles[direction], fontsize=9)
        axis.grid(True, axis="x", alpha=0.3)
    figure.suptitle(f"Which tensors resist: one group at a time from {scan.base_type}")
    return save_figure(figure, path)


SENSITIVITY_PLOT = Figure("sensitivity", "Tensor groups ranked by KLD per MiB", _sensitivity_plot)


def sensitivity_section(analysis: Analysis, plots: Plots) -> Section | None:
    """The sensitivity scan: the ranking, the proposed mix and what it measured."""
    scan = analysis.run.sensitivity
    if scan is None:
        return None
    blocks: list[Block] = [*shown(plots, SENSITIVITY_PLOT)]
    base = scan.base
    rows = []
    listed = [*([base] if base else []), *scan.ranking("raise"), *scan.ranking("lower")]
    for v in listed + ([scan.mix] if scan.mix else []):
        rows.append(
            (
                v.name,
                v.direction,
                str(v.tensors) if v.group else fmt.DASH,
                fmt.mib(v.size_bytes),
                kld_with_error(v.kld_mean_nats, v.kld_mean_error_nats),
                pct_with_error(v.same_top_p_pct),
                fmt.DASH if v.kld_change_nats is None else f"{v.kld_change_nats:+.6f}",
                fmt.DASH if v.size_change_mib is None else f"{v.size_change_mib:+.2f}",
                fmt.DASH if v.kld_per_mib is None else f"{v.kld_per_mib:.6f}",
                f"{v.seconds:.1f} s",
            )
        )
    blocks.append(
        Table(
            ("variant", "direction", "tensors", "size", "mean KLD ± s.e. (nats)", "same top token",
             "Δ KLD", "Δ MiB", "KLD per MiB", "time"),
            tuple(rows),
            (False, False, True, True, True, True, True, True, True, True),
            f"From {scan.base_type}, one tensor group at a time;"
            f" {fmt.counted(scan.chunks_scored, 'chunk')} scored."
            " Raised rows: KLD per MiB = nats removed per MiB added (higher pays more); lowered rows:"
            " nats added per MiB saved (lower costs less). Skipped groups (no tensor of the model):"
            f" {', '.join(scan.skipped_groups) or 'none'}.",
            "sensitivity",
        )
    )
    proposal = scan.proposal
    if proposal is not None:
        text = (
            f"Within {scan.limit_kld_mean_nats:g} nats (report.max_kld_mean_nats) {proposal.why}:"
            f" {', '.join(proposal.groups) or 'no group'}; predicted mean KLD"
            f" {fmt.number(proposal.predicted_kld_mean_nats, KLD_DIGITS)} nats at"
            f" {fmt.mib(proposal.predicted_size_bytes)}"
        )
        if scan.mix is not None and base is not None:
            text += (
                f"; built and measured: {fmt.number(scan.mix.kld_mean_nats, KLD_DIGITS)} nats at"
                f" {fmt.mib(scan.mix.size_bytes)}, against {scan.base_type}'s"
                f" {fmt.number(base.kld_mean_nats, KLD_DIGITS)} nats at {fmt.mib(base.size_bytes)}"
            )
        if proposal.tensor_type_file and proposal.overrides:
            text += (
                f". Build it in a run as a mix of prepare.mixes with base {scan.base_type} and"
                f" tensor_type_file {Path(proposal.tensor_type_file).name}"
            )
        blocks.append(Paragraph(text + f". The scan took {scan.seconds:.0f} s.", "verdict"))
    return Section("sensitivity", "The tensors that resist (sensitivity scan)", tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    scan = sensitivity_section(analysis, plots)
    experts = moe_section(analysis)
    return (
        quality_loss_section(analysis),
        *((scan,) if scan is not None else ()),
        quality_speed_section(analysis, plots),
        *((experts,) if experts is not None else ()),
        kv_section(analysis),
    )


CHAPTER = Chapter(_sections, (QUALITY_SPEED_SIZE, SENSITIVITY_PLOT))
