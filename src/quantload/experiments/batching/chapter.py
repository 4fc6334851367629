"""The batching experiment's section of the server flags chapter: continuous against static
batching, its verdict, one figure and the table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantload.analysis import fmt
from quantload.analysis.chapters.parts import Chapter, Plots, not_run_section, shown, value
from quantload.analysis.document import Block, Paragraph, Section, Table
from quantload.analysis.plotting import PALETTE, Figure, new_figure, save_figure
from quantload.experiments.batching.findings import findings_of

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


def _batching_plot(analysis: Analysis, path: Path) -> Path | None:
    table = findings_of(analysis).table
    if table.empty:
        return None
    figure, axes = new_figure(10.0, 4.0, 1, 2)
    groups = list(dict.fromkeys(zip(table["quant"], table["phase"], strict=True)))
    for column, (metric, title) in enumerate(
        (("ttft_p99_s", "TTFT p99"), ("wait_p99_s", "wait before its prefill, p99"))
    ):
        axis = axes[0][column]
        for offset, (args, color) in enumerate((("-cb", PALETTE[0]), ("-nocb", PALETTE[1]))):
            heights = []
            for quant, phase in groups:
                row = table[
                    (table["quant"] == quant) & (table["phase"] == phase) & (table["server_args"] == args)
                ]
                heights.append((value(row[metric].iloc[0]) or 0.0) * 1000 if not row.empty else 0.0)
            positions = [index + offset * 0.4 for index in range(len(groups))]
            axis.bar(positions, heights, width=0.4, color=color, label=f"{args}")
        axis.set_xticks([index + 0.2 for index in range(len(groups))], [f"{q}\n{p}" for q, p in groups])
        axis.set_ylabel(f"{title} (ms)")
        axis.grid(True, axis="y", alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle("Continuous (-cb) against static (-nocb) batching, the same requests")
    return save_figure(figure, path)


BATCHING_FIGURE = Figure("batching", "TTFT p99 and the wait before prefill, -cb and -nocb", _batching_plot)


def batching_section(analysis: Analysis, plots: Plots) -> Section:
    table = findings_of(analysis).table
    title = "Continuous against static batching"
    if table.empty:
        return not_run_section(
            "batching", title, "no complete stage of the batching experiment (load.experiments)"
        )
    rows = tuple(
        (
            str(r["quant"]),
            f"{r['batching']} ({r['server_args']})",
            str(r["phase"]),
            fmt.number(value(r["users"]), 0)
            if r["phase"] == "closed"
            else f"{fmt.number(value(r['rate_rps']), 2)}/s",
            f"{r['ok']} / {r['requests']}",
            fmt.duration(value(r["ttft_p50_s"])),
            fmt.duration(value(r["ttft_p99_s"])),
            fmt.duration(value(r["itl_p99_s"])),
            fmt.number(value(r["output_tok_s"]), 1),
            fmt.number(value(r["goodput_rps"]), 2),
            fmt.duration(value(r["wait_p99_s"])),
            str(r["behind"]),
            fmt.duration(value(r["behind_wait_p50_s"])),
            fmt.duration(value(r["behind_wait_p99_s"])),
        )
        for r in table.to_dict("records")
    )
    columns = (
        "quant",
        "batching",
        "part",
        "load",
        "ok / sent",
        "TTFT p50",
        "TTFT p99",
        "ITL p99",
        "output tok/s",
        "goodput req/s",
        "wait p99",
        "behind",
        "their wait p50",
        "their wait p99",
    )
    blocks: list[Block] = [
        Paragraph(
            "The same requests of the run's workload, the prompt cache off, on the server restarted with"
            " -cb (continuous batching, llama-server's default: a new request joins the next step while"
            " others generate) and with -nocb (static: pending prompts are admitted only when no slot is"
            " generating). Closed loop at the limit the run found, then Poisson arrivals near it (TTFT from"
            " the intended send time). A request's wait is its TTFT less the server's own prefill time"
            " for it (timings.prompt_ms); 'behind' counts the requests that arrived while another of the"
            " stage was generating (after its first token, before its last), and their wait is what"
            " static batching makes them pay."
        ),
        Paragraph(findings_of(analysis).verdict, "verdict"),
        *shown(plots, BATCHING_FIGURE),
        Table(columns, rows, (False, False, False, *([True] * 11))),
    ]
    return Section("batching", title, tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return (batching_section(analysis, plots),)


CHAPTER = Chapter(_sections, (BATCHING_FIGURE,))
