"""Checks of the measurement itself: Little's law (throughput x latency against requests in flight)
and the load generator's own health."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.chapters.parts import Chapter, Plots, gap_blocks_about, value
from quantload.analysis.document import Block, Details, Paragraph, Section, Table
from quantload.analysis.littles_law import TOLERANCE


def littles_law_section(analysis: Analysis) -> Section:
    """λ·W against L, client and server."""
    table = analysis.littles_law
    blocks: list[Block] = [
        Paragraph(
            "Little's law: throughput λ times mean latency W should equal the mean number of requests in"
            f" flight L. Checked over each stage's steady window (every user started, up to the last send);"
            f" flagged when λ·W and L differ by more than {fmt.percent(TOLERANCE, 0)}. L client is measured"
            " from the records' send and end times; L server is llama-server's requests_processing plus"
            " requests_deferred averaged over the scrapes inside the window."
        )
    ]
    if table.empty:
        blocks.append(Paragraph("not measured: no complete stage with at least two requests", "warning"))
    else:
        flagged = table[table["flagged"] != ""]
        unjudged = table[(table["flagged"] == "") & (table["unjudged"] != "")]
        sides = sorted({side for text in flagged["flagged"] for side in text.split(", ")})
        stages = fmt.counted(len(table), "stage")
        summary = f"{len(flagged)} of {stages} disagree by more than {fmt.percent(TOLERANCE, 0)}"
        summary += f" ({' and '.join(sides)} side)." if sides else "."
        if len(unjudged):
            were = "was" if len(unjudged) == 1 else "were"
            short = fmt.counted(len(unjudged), "stage")
            summary += f" {short} {were} too short to judge (see the last column)."
        blocks.append(Paragraph(summary, "warning" if len(flagged) else "plain"))
        rows = tuple(
            (
                str(r["quant"]),
                fmt.number(value(r["users"]), 0)
                if value(r["users"]) is not None
                else f"{value(r['rate_rps'])} req/s",
                str(r["repeat"]),
                fmt.number(r["window_s"], 2),
                str(r["completed"]),
                fmt.number(value(r["throughput_rps"]), 2),
                fmt.duration(value(r["mean_latency_s"])),
                fmt.number(value(r["predicted_in_flight"]), 2),
                fmt.number(value(r["client_in_flight"]), 2),
                fmt.number(_server_total(r), 2),
                str(r["server_samples"]),
                fmt.percent(value(r["client_diff"]), 0, True),
                fmt.percent(value(r["server_diff"]), 0, True),
                r["flagged"] or r["unjudged"] or "ok",
            )
            for r in table.to_dict("records")
        )
        columns = (
            "quant",
            "users",
            "repeat",
            "window s",
            "completed",
            "λ req/s",
            "W",
            "λ·W",
            "L client",
            "L server",
            "scrapes",
            "vs client",
            "vs server",
            "flag",
        )
        blocks.append(Details("Every stage", (Table(columns, rows, (False, *([True] * 12), False)),)))
    blocks += gap_blocks_about(analysis, "Little's law")
    return Section("littles_law", "Little's law check", tuple(blocks))


def _server_total(row: Mapping[str, Any]) -> float | None:
    processing = value(row["server_processing"])
    return None if processing is None else processing + (value(row["server_deferred"]) or 0.0)


def client_section(analysis: Analysis) -> Section:
    """The load generator's own health."""
    blocks: list[Block] = [
        Paragraph(analysis.client_sentence, "warning" if not analysis.lagging.empty else "plain")
    ]
    if not analysis.lagging.empty:
        rows = tuple(
            (
                str(r["quant"]),
                str(r["experiment"]),
                str(r["users"]),
                str(r["repeat"]),
                fmt.duration(value(r["lag_p99_s"])),
                fmt.duration(value(r["loop_lag_p99_s"])),
                fmt.percent(value(r["client_cpu_frac"]), 0),
                str(r["why"]),
            )
            for r in analysis.lagging.to_dict("records")
        )
        columns = (
            "quant",
            "experiment",
            "users",
            "repeat",
            "send lag p99",
            "loop lag p99",
            "client CPU",
            "why",
        )
        blocks.append(Table(columns, rows, (False, False, True, True, True, True, True, False)))
    return Section("client", "Load generator health", tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return littles_law_section(analysis), client_section(analysis)


CHAPTER = Chapter(_sections)
