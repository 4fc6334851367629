"""The open loop's chapter: one section, its levels per quantization and rate with latency from
each request's intended send time (the load chapter's last section as it was)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantload.analysis import fmt
from quantload.analysis.chapters.parts import (
    Chapter,
    Plots,
    cache_state_block,
    not_run_section,
    range_text,
    value,
)
from quantload.analysis.document import Block, Section, Table
from quantload.experiments.open_loop.findings import findings_of

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


def open_loop_section(analysis: Analysis) -> Section:
    """Poisson arrivals at set rates; latency from the intended send time."""
    table = findings_of(analysis).levels
    if table.empty:
        return not_run_section(
            "open_loop", "Open loop (Poisson arrivals)", "no open-loop rates were configured (load.rates_rps)"
        )
    rows = tuple(
        (
            str(r["quant"]),
            f"{fmt.number(value(r['rate_rps']), 2)} req/s",
            range_text(r, "requests_per_s", "number"),
            range_text(r, "ttft_from_intended_p50_s"),
            range_text(r, "ttft_from_intended_p99_s"),
            range_text(r, "tpot_p99_s"),
            range_text(r, "output_tok_s", "number"),
            fmt.percent(value(r["failed_frac"])),
            fmt.percent(value(r["good_frac"])),
        )
        for r in table.to_dict("records")
    )
    columns = ("quant", "target rate", "achieved req/s", "TTFT p50", "TTFT p99", "TPOT p99", "output tok/s",
               "failed", "good requests")  # fmt: skip
    caption = (
        "TTFT here runs from each request's intended send time (its Poisson arrival), so a client that"
        " fell behind cannot hide queueing; median of repeats (min–max)."
    )
    blocks: list[Block] = [*cache_state_block(analysis, "open loop")]
    blocks.append(Table(columns, rows, (False, *([True] * 8)), caption))
    return Section("open_loop", "Open loop (Poisson arrivals)", tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return (open_loop_section(analysis),)


CHAPTER = Chapter(_sections)
