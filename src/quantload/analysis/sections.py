"""The report's sections, built from an Analysis into the renderer-neutral Document: the overview,
quality and speed, KV and method here; load and check sections in their own modules."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.capacity import slo_text
from quantload.analysis.document import (
    Block,
    Bullets,
    Details,
    Document,
    Facts,
    Paragraph,
    Section,
    Table,
)
from quantload.analysis.section_parts import (
    gap_blocks,
    image_block,
)
from quantload.analysis.sections_checks import client_section, littles_law_section, server_section
from quantload.analysis.sections_load import (
    capacity_section,
    load_plots,
    open_loop_section,
    prompt_cache_section,
    seed_section,
    stages_section,
    ttft_split_section,
)
from quantload.analysis.stats import PERCENTILE_METHOD_TEXT
from quantload.roofline.speed_file import busy_note


def overview(analysis: Analysis) -> Section:
    """Run facts, the verdicts, what is missing."""
    header = analysis.header
    blocks: list[Block] = [Facts(tuple(header.facts()))]
    if header.cache_states:
        blocks.append(Facts(tuple((f"cache state: {k}", v) for k, v in header.cache_states)))
    blocks.append(Paragraph(f"Service-level objective (SLO): {slo_text(analysis.slo)}."))
    blocks.append(Bullets(tuple(v.sentence for v in analysis.capacity), "verdict"))
    blocks.append(Paragraph(analysis.client_sentence, "warning" if not analysis.lagging.empty else "plain"))
    gaps = [gap.text() for gap in analysis.gaps]
    if gaps:
        blocks.append(
            Paragraph(f"{len(gaps)} thing(s) were not measured; each section says which:", "warning")
        )
        blocks.append(Bullets(tuple(dict.fromkeys(gaps)), "warning"))
    notes = list(header.run_notes) + list(analysis.notes)
    if notes:
        blocks.append(Details("Notes from the run", (Bullets(tuple(notes), "muted"),)))
    return Section("overview", "Run and verdict", tuple(blocks))


def quality_speed_section(analysis: Analysis, plots: Mapping[str, Path | None], out_dir: Path) -> Section:
    """Quality details, the quality/speed/size plot and the roofline."""
    blocks: list[Block] = [*image_block(plots, "quality_speed_size", out_dir)]
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


def method_section(analysis: Analysis) -> Section:
    """How the numbers were made."""
    items = (
        f"Percentiles: {PERCENTILE_METHOD_TEXT}.",
        "Each stage is repeated; a load figure is the median of the complete repeats, with min–max beside"
        " it. Warm-up requests, failed, aborted and unfinished stages are left out.",
        "TTFT: from sending the request to the first chunk carrying generated text. TPOT: (e2e − TTFT) /"
        " (completion tokens − 1). Output tokens/s: completion tokens of a stage over the time from its"
        " first send to its last response.",
        f"SLO: {slo_text(analysis.slo)}.",
        "Prometheus histograms are a cross-check only: they place a quantile within a bucket.",
        "Numbers are never filled in: a missing measurement shows as – with a note saying why.",
    )
    return Section("method", "Method", (Bullets(items, "muted"),))


def build_document(analysis: Analysis, plots: Mapping[str, Path | None], out_dir: Path) -> Document:
    """The whole report."""
    model = analysis.header.model or "model not recorded"
    sections = (
        overview(analysis),
        seed_section(analysis),
        load_plots(analysis, plots, out_dir),
        capacity_section(analysis),
        open_loop_section(analysis),
        ttft_split_section(analysis),
        prompt_cache_section(analysis),
        quality_speed_section(analysis, plots, out_dir),
        kv_section(analysis),
        littles_law_section(analysis),
        client_section(analysis),
        server_section(analysis, plots, out_dir),
        stages_section(analysis),
        method_section(analysis),
    )
    return Document(f"quantload report: {model}", f"run {analysis.header.run_id}", tuple(sections))
