"""The report's opening: the run and its verdict, then the quantization table (one row per
quantization: file size, quality, speed and the sweep's load figures)."""

from __future__ import annotations

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.capacity import slo_text
from quantload.analysis.chapters.parts import Chapter, Plots, cache_state_block, gap_blocks, range_text, value
from quantload.analysis.document import Block, Bullets, Details, Facts, Paragraph, Section, Table
from quantload.analysis.quality_loss import KLD_DIGITS
from quantload.analysis.run_tables import level_column, users_levels


def overview_section(analysis: Analysis) -> Section:
    """Run facts, the verdicts, what is missing."""
    header = analysis.header
    blocks: list[Block] = [Facts(tuple(header.facts()))]
    if header.cache_states:
        blocks.append(Facts(tuple((f"cache state: {k}", v) for k, v in header.cache_states)))
    blocks.append(Paragraph(f"Service-level objective (SLO): {slo_text(analysis.slo)}."))
    blocks.append(Bullets(tuple(v.sentence for v in analysis.capacity), "verdict"))
    blocks.append(Paragraph(analysis.quality_verdict.sentence, "verdict"))
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


def _plus_minus(number: float | None, spread: float | None, digits: int = 1) -> str:
    """'12.3 ± 0.4', just the number when there is no spread, a dash when there is no number."""
    if number is None:
        return fmt.DASH
    text = fmt.number(number, digits)
    return f"{text} ± {fmt.number(spread, digits)}" if spread is not None else text


def _pct(number: float | None) -> str:
    """'96.77 %' from a percentage, a dash when there is none."""
    return fmt.DASH if number is None else f"{fmt.number(number, 2)} %"


def quant_table_section(analysis: Analysis) -> Section:
    """The quantization table, one row per quantization."""
    levels = users_levels(analysis.run, analysis.levels)
    columns = [
        "quant", "type", "file size", "imatrix", "perplexity ± s.e.", "mean KLD ± s.e. (nats)",
        "same top token", "prefill tok/s ± sd", "decode tok/s ± sd",
    ]  # fmt: skip
    for users in levels:
        columns += [f"TTFT p50 @{users}u", f"TTFT p99 @{users}u", f"output tok/s @{users}u"]
    rows = []
    for row in analysis.quant_table.to_dict("records"):
        ppl, err = value(row["perplexity"]), value(row["perplexity_error"])
        cells = [
            str(row["quant"]),
            str(row["file_type"] or fmt.DASH),
            fmt.mib(value(row["file_size_bytes"])),
            str(row["imatrix"] or fmt.DASH),
            _plus_minus(ppl, err, 3),
            _plus_minus(value(row["kld_mean_nats"]), value(row["kld_mean_error_nats"]), KLD_DIGITS),
            _pct(value(row["same_top_p_pct"])),
            _plus_minus(value(row["prefill_tok_s"]), value(row["prefill_stddev_tok_s"])),
            _plus_minus(value(row["decode_tok_s"]), value(row["decode_stddev_tok_s"])),
        ]
        for users in levels:
            cells += [
                range_text(row, level_column("ttft_p50_s", users)),
                range_text(row, level_column("ttft_p99_s", users)),
                range_text(row, level_column("output_tok_s", users), "number"),
            ]
        rows.append(tuple(cells))
    caption = (
        "Rows largest file first. Type: the file's own general.file_type (a mix shows its base type);"
        " imatrix: the importance matrix it was made with, from its own quantize.imatrix.* metadata."
        " Load figures: concurrency sweep, median of the complete repeats with the min–max range in"
        " brackets; percentiles exact from the records. Perplexity ± one standard error"
        " (llama-perplexity). Quality loss against F16 (f16 KV cache; F16's own row is the floor): mean KL"
        " divergence ± the larger of its per-token and per-chunk standard errors, and the share of tokens"
        " whose most likely next token is F16's. tok/s ± standard deviation over llama-bench"
        " repetitions. – = not measured."
    )
    blocks: list[Block] = [*cache_state_block(analysis, "concurrency sweep")]
    blocks.append(
        Table(
            tuple(columns),
            tuple(rows),
            (False, False, True, False, *([True] * (len(columns) - 4))),
            caption,
            "quant-table",
        )
    )
    blocks += gap_blocks(analysis, "model files", "quality", "speed", "load")
    return Section("table", "The table: one row per quantization", tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return overview_section(analysis), quant_table_section(analysis)


CHAPTER = Chapter(_sections)
