"""Where TTFT goes: the split into queueing+network and the server's prefill. The prompt-cache
experiment's section (TTFT with caching off and on) follows it, from the experiment's own folder
under quantload.experiments."""

from __future__ import annotations

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.chapters.parts import Chapter, Plots, value
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


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return (ttft_split_section(analysis),)


CHAPTER = Chapter(_sections)
