"""The trace replay's chapter: one section, the replay per quantization (the pace kept, latency
from the intended send time, the client's lag), shown first within the traffic chapter."""

from __future__ import annotations

from typing import TYPE_CHECKING

from quantload.analysis import fmt
from quantload.analysis.chapters.parts import Chapter, Plots, not_run_section, value
from quantload.analysis.document import Paragraph, Section, Table
from quantload.experiments.trace.findings import findings_of

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


def trace_section(analysis: Analysis) -> Section:
    """A trace replayed open loop: the pace kept, latency from the intended send time, client lag."""
    chosen = findings_of(analysis).stages
    if chosen.empty:
        return not_run_section("trace", "Trace replay", "no trace was given (trace.path)")
    rows = tuple(
        (
            str(r["quant"]),
            str(r.get("phase") or ""),
            str(r["status"]),
            f"{r['ok']} / {r['requests']}",
            fmt.number(value(r["rate_rps"]), 2),
            fmt.number(value(r["requests_per_s"]), 2),
            fmt.duration(value(r["ttft_from_intended_p50_s"])),
            fmt.duration(value(r["ttft_from_intended_p99_s"])),
            fmt.duration(value(r["lag_p50_s"])),
            fmt.duration(value(r["lag_p99_s"])),
            fmt.duration(value(r["lag_max_s"])),
        )
        for r in chosen.to_dict("records")
    )
    columns = ("quant", "speed", "status", "ok / sent", "trace req/s", "achieved req/s", "TTFT p50",
               "TTFT p99", "client lag p50", "lag p99", "lag max")  # fmt: skip
    return Section(
        "trace",
        "Trace replay",
        (
            Paragraph(
                "Requests were sent open loop at the trace's own arrival times (divided by the speed"
                " factor); TTFT runs from each request's intended send time, so queueing behind a slow"
                " server is counted. Client lag is how late the load generator sent a request after it"
                " was due: large lag means the figures also hold the client's delay."
            ),
            Table(columns, rows, (False, False, False, *([True] * 8))),
        ),
    )


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return (trace_section(analysis),)


CHAPTER = Chapter(_sections)
