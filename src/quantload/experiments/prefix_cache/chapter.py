"""The prompt-cache experiment's chapter: one section, TTFT with cache_prompt off against on per
quantization, and the tokens the server reused (the ttft chapter's last section as it was)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantload.analysis import fmt
from quantload.analysis.chapters.parts import Chapter, Plots, cache_state_block, gap_blocks
from quantload.analysis.document import Block, Paragraph, Section, Table
from quantload.experiments.prefix_cache.findings import GAP_SECTION, findings_of

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


def prompt_cache_section(analysis: Analysis) -> Section:
    """Cache off against on."""
    blocks: list[Block] = [*cache_state_block(analysis, "prompt-cache experiment")]
    rows = []
    for item in findings_of(analysis).comparisons:
        off, on = item.off, item.on
        rows.append(
            (
                item.quant,
                str(item.prefix_tokens or fmt.DASH),
                fmt.with_range(off.ttft_p50_s, *off.ttft_p50_range_s) if off else fmt.DASH,
                fmt.with_range(on.ttft_p50_s, *on.ttft_p50_range_s) if on else fmt.DASH,
                f"{item.speedup_p50:.2f}×" if item.speedup_p50 else fmt.DASH,
                fmt.with_range(off.ttft_p99_s, *off.ttft_p99_range_s) if off else fmt.DASH,
                fmt.with_range(on.ttft_p99_s, *on.ttft_p99_range_s) if on else fmt.DASH,
                f"{item.speedup_p99:.2f}×" if item.speedup_p99 else fmt.DASH,
                fmt.number(off.cache_n_mean, 0) if off else fmt.DASH,
                fmt.number(on.cache_n_mean, 0) if on else fmt.DASH,
            )
        )
    if rows:
        columns = (
            "quant",
            "shared prefix tokens",
            "TTFT p50 off",
            "TTFT p50 on",
            "speed-up p50",
            "TTFT p99 off",
            "TTFT p99 on",
            "speed-up p99",
            "reused tokens off",
            "reused tokens on",
        )
        caption = (
            "Median of repeats (min–max). Speed-up = TTFT off / TTFT on. Reused tokens: mean of the"
            " server's timings.cache_n, the prompt tokens it took from the cache."
        )
        blocks.append(Table(columns, tuple(rows), (False, *([True] * 9)), caption))
    blocks += gap_blocks(analysis, GAP_SECTION)
    if not rows and not blocks:
        blocks.append(Paragraph("not measured: the run has no prompt-cache stages", "warning"))
    return Section("prompt_cache", "Prompt cache: TTFT with caching off and on", tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return (prompt_cache_section(analysis),)


CHAPTER = Chapter(_sections)
