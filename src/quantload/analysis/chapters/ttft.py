"""Where TTFT goes: the split into queueing+network and the server's prefill, and the prompt-cache
experiment (TTFT with caching off and on)."""

from __future__ import annotations

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.chapters.parts import Chapter, Plots, cache_state_block, gap_blocks, value
from quantload.analysis.document import Block, Paragraph, Section, Table


def ttft_split_section(analysis: Analysis) -> Section:
    """Queueing+network against prefill."""
    table = analysis.ttft_split
    blocks: list[Block] = [
        Paragraph(
            "llama-server's timings.prompt_ms runs from the moment a slot takes the request to the end of"
            " its prompt (prefill); the rest of the client's TTFT is queueing for a slot, the network and"
            " HTTP handling. Pooled over the complete repeats of each level; p50 and p99 of each part are"
            " taken separately, so they need not add up."
        )
    ]
    if table.empty:
        blocks.append(Paragraph("not measured: no complete sweep stage with server timings", "warning"))
    else:
        rows = tuple(
            (
                str(r["quant"]),
                str(r["users"]),
                str(r["requests"]),
                fmt.duration(value(r["ttft_p50_s"])),
                fmt.duration(value(r["prefill_p50_s"])),
                fmt.duration(value(r["queue_network_p50_s"])),
                fmt.percent(value(r["queue_share_p50"]), 0),
                fmt.duration(value(r["ttft_p99_s"])),
                fmt.duration(value(r["prefill_p99_s"])),
                fmt.duration(value(r["queue_network_p99_s"])),
            )
            for r in table.to_dict("records")
        )
        columns = (
            "quant",
            "users",
            "requests",
            "TTFT p50",
            "prefill p50",
            "queue+network p50",
            "queue share",
            "TTFT p99",
            "prefill p99",
            "queue+network p99",
        )
        blocks.append(Table(columns, rows, (False, *([True] * 9))))
        negative = int(table["negative_queue"].sum())
        if negative:
            blocks.append(
                Paragraph(
                    f"{fmt.counted(negative, 'request')} had a server prompt time longer than the client's"
                    " TTFT; the split is approximate for them.",
                    "muted",
                )
            )
    return Section("ttft_split", "Where TTFT goes: queueing+network and prefill", tuple(blocks))


def prompt_cache_section(analysis: Analysis) -> Section:
    """Cache off against on."""
    blocks: list[Block] = [*cache_state_block(analysis, "prompt-cache experiment")]
    rows = []
    for item in analysis.prompt_cache:
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
    blocks += gap_blocks(analysis, "prompt_cache")
    if not rows and not blocks:
        blocks.append(Paragraph("not measured: the run has no prompt-cache stages", "warning"))
    return Section("prompt_cache", "Prompt cache: TTFT with caching off and on", tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return ttft_split_section(analysis), prompt_cache_section(analysis)


CHAPTER = Chapter(_sections)
