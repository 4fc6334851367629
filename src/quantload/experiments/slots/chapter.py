"""The slots experiment's section of the server flags chapter: slots at a fixed KV budget, its
verdict, one figure and the table."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantload.analysis import fmt
from quantload.analysis.chapters.parts import Chapter, Plots, not_run_section, shown, value
from quantload.analysis.document import Paragraph, Section, Table
from quantload.analysis.plotting import Figure, colors, new_figure, save_figure
from quantload.experiments.slots.findings import findings_of

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


def _slots_plot(analysis: Analysis, path: Path) -> Path | None:
    table = findings_of(analysis).table
    if table.empty or table["limit_users"].dropna().empty:
        return None
    figure, axes = new_figure(10.0, 4.0, 1, 2)
    palette = colors(analysis.quants)
    for quant, group in table.groupby("quant", sort=False):
        slots = [int(s) for s in group["slots"]]
        axes[0][0].plot(slots, group["limit_users"], "-o", color=palette.get(str(quant)), label=str(quant))
        axes[0][1].plot(slots, group["goodput_rps"], "-o", color=palette.get(str(quant)), label=str(quant))
    for axis, label in (
        (axes[0][0], "users within the SLO (limit search)"),
        (axes[0][1], "goodput at the limit (req/s)"),
    ):
        axis.set_xscale("log", base=2)
        ticks = sorted({int(s) for s in table["slots"]})
        axis.set_xticks(
            ticks, [f"{s}\n{int(table[table['slots'] == s]['ctx_per_slot'].iloc[0]):,}" for s in ticks]
        )
        axis.minorticks_off()
        axis.set_xlabel("-np (slots) / tokens per slot")
        axis.set_ylabel(label)
        axis.set_ylim(bottom=0)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle("Slots at a fixed KV budget: the same KV cache split into more, smaller slots")
    return save_figure(figure, path)


SLOTS_FIGURE = Figure(
    "slots", "Users and goodput at the limit per -np, the KV cache the same size", _slots_plot
)


def slots_section(analysis: Analysis, plots: Plots) -> Section:
    table = findings_of(analysis).table
    title = "Slots at a fixed KV budget"
    if table.empty:
        return not_run_section("slots", title, "no limit search of the slots experiment (load.experiments)")
    rows = tuple(
        (
            str(r["quant"]),
            str(r["slots"]),
            fmt.number(value(r["ctx_per_slot"]), 0),
            fmt.number(value(r["kv_predicted_mib"]), 2),
            fmt.number(value(r["kv_reported_mib"]), 2),
            fmt.number(value(r["memory_mib"]), 0),
            fmt.number(value(r["limit_users"]), 0),
            str(r.get("undecided") or fmt.DASH),
            fmt.number(value(r.get("misses_from")), 0),
            fmt.number(value(r["goodput_rps"]), 2),
            f"{r['refused']} / {r['cut']} of {r['requests']}",
            fmt.percent(value(r["need_over_frac"]), 0),
        )
        for r in table.to_dict("records")
    )
    columns = (
        "quant",
        "-np",
        "tokens per slot",
        "KV MiB (exact)",
        "KV MiB reported",
        "memory MiB",
        "limit (users)",
        "undecided",
        "misses from",
        "goodput req/s",
        "refused / cut",
        "needs more",
    )
    return Section(
        "slots",
        title,
        (
            Paragraph(
                "For each slot count the server restarted with -np N and the same -c, so each slot holds"
                " the budget divided by N and the KV cache stays exactly the same size (predicted from the"
                " model's shape, and as each server logged it); the limit search for users ran on each."
                " 'Refused' requests exceeded a slot's context (HTTP 400), 'cut' ones stopped at its end"
                " before their max_tokens; 'needs more' is the share of this workload's requests whose"
                " prompt plus asked output is longer than a slot."
            ),
            Paragraph(findings_of(analysis).verdict, "verdict"),
            *shown(plots, SLOTS_FIGURE),
            Table(columns, rows, (False, *([True] * 11))),
        ),
    )


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return (slots_section(analysis, plots),)


CHAPTER = Chapter(_sections, (SLOTS_FIGURE,))
