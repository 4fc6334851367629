"""The report's opening, what fits the first screen: the answer (the choice, its evidence, what
limits it, and whether the machine rather than the server was measured), then a compact table,
one row per quantization (every column in a folded details table and in table.csv), then the
verdicts in full and the run's details, folded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.capacity import CapacityVerdict, slo_text
from quantload.analysis.chapters.parts import Chapter, Plots, cache_state_block, gap_blocks, range_text, value
from quantload.analysis.decision import decision
from quantload.analysis.document import Block, Bullets, Callout, Details, Facts, Paragraph, Section, Table
from quantload.analysis.quality_loss import KLD_DIGITS, nats_shown
from quantload.analysis.run_tables import level_column, users_levels


def answer_section(analysis: Analysis) -> Section:
    """The box the report leads with, and the line that says what it was judged against."""
    found = decision(analysis)
    header = analysis.header
    box = Callout(found.heading, found.lines, found.busy.sentence())
    said = (
        f"Judged against the SLO: {slo_text(analysis.slo)}. Run {header.run_id}"
        f" ({header.profile or 'unknown'} profile, {header.status}; ended {header.finished})."
    )
    return Section("answer", "The answer", (box, Paragraph(said, "muted")))


def overview_section(analysis: Analysis) -> Section:
    """The verdicts in full, what is missing, and the run's facts, folded."""
    header = analysis.header
    blocks: list[Block] = [Paragraph(f"Service-level objective (SLO): {slo_text(analysis.slo)}.")]
    blocks.append(Bullets(tuple(v.sentence for v in analysis.capacity), "verdict"))
    blocks.append(Paragraph(analysis.quality_verdict.sentence, "verdict"))
    blocks.append(Paragraph(analysis.client_sentence, "warning" if not analysis.lagging.empty else "plain"))
    gaps = tuple(dict.fromkeys(gap.text() for gap in analysis.gaps))
    if gaps:
        verb = "is" if len(gaps) == 1 else "are"
        summary = f"{fmt.counted(len(gaps), 'measurement')} the run meant to make {verb} missing"
        blocks.append(Details(summary, (Bullets(gaps, "warning"),)))
    facts: list[Block] = [Facts(tuple(header.facts()))]
    if header.cache_states:
        facts.append(Facts(tuple((f"cache state: {k}", v) for k, v in header.cache_states)))
    blocks.append(Details("Run details: model, llama.cpp, machine, times, cache states", tuple(facts)))
    notes = list(header.run_notes) + list(analysis.notes)
    if notes:
        blocks.append(Details("Notes from the run", (Bullets(tuple(notes), "muted"),)))
    return Section("overview", "Verdicts and run details", tuple(blocks))


def _plus_minus(number: float | None, spread: float | None, digits: int = 1) -> str:
    """'12.3 ± 0.4', just the number when there is no spread, a dash when there is no number."""
    if number is None:
        return fmt.DASH
    text = fmt.number(number, digits)
    return f"{text} ± {fmt.number(spread, digits)}" if spread is not None else text


def _kld(number: float | None, spread: float | None) -> str:
    if number is None:
        return fmt.DASH
    text = nats_shown(number)
    return f"{text} ± {fmt.number(spread, KLD_DIGITS)}" if spread is not None else text


def _pct(number: float | None) -> str:
    """'96.77 %' from a percentage, a dash when there is none."""
    return fmt.DASH if number is None else f"{fmt.number(number, 2)} %"


def _held(verdict: CapacityVerdict | None) -> str:
    """The most users shown to meet the SLO, with where misses begin: '6 (misses at 7)'."""
    if verdict is None or not (verdict.checks or verdict.searched_users is not None):
        return fmt.DASH
    held = verdict.held_users
    miss = verdict.limit_range().missed
    if held is None:
        return "undecided" if verdict.undecided_users else "none"
    after = f"\nmisses at {miss:g}" if miss is not None else "\nno miss found"
    return f"{held}{after}"


def _level_cell(row: Mapping[str, Any], users: int) -> str:
    p50 = value(row.get(level_column("ttft_p50_s", users)))
    p99 = value(row.get(level_column("ttft_p99_s", users)))
    rate = value(row.get(level_column("output_tok_s", users)))
    if p50 is None and p99 is None and rate is None:
        return fmt.DASH
    return f"{fmt.duration(p50)} / {fmt.duration(p99)}\n{fmt.number(rate)} tok/s"


def _repeats_words(analysis: Analysis) -> str:
    levels = analysis.levels
    most = int(levels["repeats_used"].max()) if not levels.empty else 0
    if most > 1:
        return f"the median of up to {most} repeats (their ranges: Every column, below)"
    return "one repeat per level"


def compact_table(analysis: Analysis) -> Table:
    """One row per quantization, narrow enough for a 1,400-pixel screen: size, quality, speed, the
    most users within the SLO, and TTFT and output tokens/s at each level."""
    levels = users_levels(analysis.run, analysis.levels)
    by_quant = {v.quant: v for v in analysis.capacity}
    columns = [
        "quant", "file size", "perplexity", "mean KLD (nats)", "decode tok/s", "prefill tok/s",
        "most users in SLO",
    ]  # fmt: skip
    columns += [f"{users} user{'s' if users != 1 else ''}\nTTFT p50 / p99\noutput" for users in levels]
    rows = []
    for row in analysis.quant_table.to_dict("records"):
        cells = [
            str(row["quant"]),
            fmt.mib(value(row["file_size_bytes"])),
            _plus_minus(value(row["perplexity"]), value(row["perplexity_error"]), 3),
            _kld(value(row["kld_mean_nats"]), value(row["kld_mean_error_nats"])),
            _plus_minus(value(row["decode_tok_s"]), value(row["decode_stddev_tok_s"])),
            _plus_minus(value(row["prefill_tok_s"]), value(row["prefill_stddev_tok_s"])),
            _held(by_quant.get(str(row["quant"]))),
        ]
        cells += [_level_cell(row, users) for users in levels]
        rows.append(tuple(cells))
    caption = (
        "Rows largest file first. Perplexity and mean KLD from F16 ± one standard error (F16's own KLD"
        " is the floor); decode and prefill: llama-bench, one stream, ± standard deviation. Most users"
        " in SLO: the limit search's where the run searched, else the sweep's. Each load level: TTFT p50"
        f" / p99 and output tokens/s of the concurrency sweep, {_repeats_words(analysis)}."
        " – = not measured."
    )
    return Table(
        tuple(columns), tuple(rows), (False, *([True] * (len(columns) - 1))), caption, "quant-table"
    )


def full_table(analysis: Analysis) -> Table:
    """Every column the table had before it was made to fit a screen (table.csv has more)."""
    levels = users_levels(analysis.run, analysis.levels)
    columns = [
        "quant", "type", "file size", "imatrix", "perplexity ± s.e.", "mean KLD ± s.e. (nats)",
        "same top token", "prefill tok/s ± sd", "decode tok/s ± sd",
    ]  # fmt: skip
    for users in levels:
        columns += [f"TTFT p50 @{users}u", f"TTFT p99 @{users}u", f"output tok/s @{users}u"]
    rows = []
    for row in analysis.quant_table.to_dict("records"):
        cells = [
            str(row["quant"]),
            str(row["file_type"] or fmt.DASH),
            fmt.mib(value(row["file_size_bytes"])),
            str(row["imatrix"] or fmt.DASH),
            _plus_minus(value(row["perplexity"]), value(row["perplexity_error"]), 3),
            _kld(value(row["kld_mean_nats"]), value(row["kld_mean_error_nats"])),
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
    spread = (
        "median of the complete repeats with the min–max range in brackets"
        if _repeats_words(analysis) != "one repeat per level"
        else "one repeat per level, so no range"
    )
    caption = (
        "Type: the file's own general.file_type (a mix shows its base type); imatrix: the importance"
        " matrix it was made with, from its own quantize.imatrix.* metadata. Load figures: concurrency"
        f" sweep, {spread}; percentiles exact from the records. Quality loss against F16 (f16 KV cache):"
        " mean KL divergence ± the larger of its per-token and per-chunk standard errors, and the share"
        " of tokens whose most likely next token is F16's. – = not measured."
    )
    return Table(
        tuple(columns), tuple(rows), (False, False, True, False, *([True] * (len(columns) - 4))), caption,
        "quant-table-full",
    )  # fmt: skip


def quant_table_section(analysis: Analysis) -> Section:
    """The compact table, every column folded beneath it, and what is missing from it."""
    blocks: list[Block] = [*cache_state_block(analysis, "concurrency sweep"), compact_table(analysis)]
    blocks.append(Details("Every column (table.csv holds these and more)", (full_table(analysis),)))
    blocks += gap_blocks(analysis, "model files", "quality", "speed", "load")
    return Section("table", "The table: one row per quantization", tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return answer_section(analysis), quant_table_section(analysis), overview_section(analysis)


CHAPTER = Chapter(_sections)
