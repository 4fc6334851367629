"""The report's appendix: every load stage, and how the numbers were made."""

from __future__ import annotations

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.capacity import slo_text
from quantload.analysis.chapters.parts import Chapter, Plots, value
from quantload.analysis.document import Bullets, Details, Paragraph, Section, Table
from quantload.analysis.stats import PERCENTILE_METHOD_TEXT


def stages_section(analysis: Analysis) -> Section:
    """Every stage, for the curious."""
    table = analysis.stages
    if table.empty:
        return Section("stages", "Every load stage", (Paragraph("not measured: no load stages", "warning"),))
    rows = tuple(
        (
            str(r["quant"]),
            str(r["experiment"]),
            f"{r['rate_rps']} req/s" if value(r["rate_rps"]) is not None else str(r["users"]),
            str(r["repeat"]),
            "on" if r["cache_prompt"] else "off",
            str(r["status"]),
            f"{r['ok']} / {r['requests']}",
            fmt.duration(value(r["ttft_p50_s"])),
            fmt.duration(value(r["ttft_p99_s"])),
            fmt.duration(value(r["tpot_p50_s"])),
            fmt.duration(value(r["e2e_p50_s"])),
            fmt.number(value(r["output_tok_s"])),
            fmt.duration(value(r["lag_p99_s"])),
        )
        for r in table.to_dict("records")
    )
    columns = (
        "quant",
        "experiment",
        "users",
        "repeat",
        "cache",
        "status",
        "ok / sent",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "e2e p50",
        "output tok/s",
        "send lag p99",
    )
    return Section(
        "stages",
        "Every load stage",
        (
            Details(
                fmt.counted(len(rows), "stage"),
                (Table(columns, rows, (False, False, True, True, False, False, *([True] * 7))),),
            ),
        ),
    )


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


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return stages_section(analysis), method_section(analysis)


CHAPTER = Chapter(_sections)
