"""The server's flags by measurement: one chapter whose sections are those of the flag experiments
(continuous against static batching, slots at a fixed KV budget, speculative decoding: each in its
folder of quantload.experiments, declaring `within="server_flags"` on its ExperimentReport, in the
registry's order) and then `quantload tune` (1 figure), which is no experiment and whose section is
here. Each section has its one-sentence verdict."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.chapters.parts import Chapter, Plots, not_run_section, shown, value
from quantload.analysis.document import Block, Bullets, Paragraph, Section, Table
from quantload.analysis.plotting import PALETTE, Figure, new_figure, save_figure

KEY = "server_flags"  # what an experiment's report part names in `within` to be shown here


# ----------------------------------------------------------------------------- tune


def _tune_plot(analysis: Analysis, path: Path) -> Path | None:
    trials = analysis.tune.trials
    measured = trials[~trials["baseline"] & trials["ran"]] if not trials.empty else trials
    if measured.empty:
        return None
    quants = list(dict.fromkeys(trials["quant"]))
    figure, axes = new_figure(10.0, 3.6 * len(quants), len(quants), 1)
    for row, quant in enumerate(quants):
        axis = axes[row][0]
        mine = measured[measured["quant"] == quant]
        keys = list(dict.fromkeys(mine["key"]))
        for rung, group in mine.groupby("rung"):
            axis.scatter(
                [keys.index(k) for k in group["key"]],
                group["limit"].fillna(0),
                s=20 + 25 * int(rung),
                color=PALETTE[(int(rung) - 1) % len(PALETTE)],
                label=f"rung {rung}",
            )
        base = trials[(trials["quant"] == quant) & trials["baseline"]]
        if not base.empty and base["limit"].notna().any():
            axis.axhline(
                float(base["limit"].iloc[0]),
                color="black",
                linestyle="--",
                linewidth=0.8,
                label="configured flags",
            )
        axis.set_xticks(range(len(keys)), [k.replace(" ", "\n", 3) for k in keys], fontsize=6)
        unit = "users" if analysis.tune.objective != "rate" else "req/s"
        axis.set_ylabel(f"{quant}: limit ({unit})")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle("quantload tune: each configuration's limit by rung (later rungs: fewer, longer trials)")
    return save_figure(figure, path)


TUNE_FIGURE = Figure("tune", "The tune's trials: limit per configuration and rung", _tune_plot)


def tune_section(analysis: Analysis, plots: Plots) -> Section:
    tables = analysis.tune
    title = "Tuned server flags"
    if tables.trials.empty:
        return not_run_section("tune", title, "the run did not tune (run.tune, or quantload tune)")
    blocks: list[Block] = [
        Paragraph(
            "quantload tune searched the [tune] space of server flags by successive halving: every"
            " configuration got a short limit search first, the best of each rung a longer one, the"
            " finalists one with the limit search's repeats; goodput at the limit breaks ties. The"
            " configured flags were searched as the finalists were, for comparison."
        ),
        Paragraph(analysis.tune_verdict, "verdict"),
        *shown(plots, TUNE_FIGURE),
    ]
    for quant, outcome in tables.outcomes.items():
        rows = tuple(
            (
                str(r["rank"]),
                str(r["key"]),
                "-" if r["rung"] < 0 else str(r["rung"] + 1),
                fmt.number(value(r["limit"]), 2),
                fmt.number(value(r.get("lowest_miss")), 2),
                "yes" if r.get("dropped") else "no",
                fmt.number(value(r["goodput_rps"]), 2),
                fmt.number(value(r["memory_mib"]), 0),
                fmt.number(value(r["seconds"]), 0),
                "" if r["ran"] else str(r["why"]),
            )
            for r in outcome.get("ranking", [])
        )
        blocks.append(
            Table(
                (
                    "#",
                    "configuration",
                    "rung",
                    "limit (meets)",
                    "misses from",
                    "beaten",
                    "goodput req/s",
                    "memory MiB",
                    "trials s",
                    "did not run",
                ),
                rows,
                (True, False, True, True, True, False, True, True, True, False),
                f"{quant}: configurations, best first",
            )
        )
        if outcome.get("command"):
            blocks.append(Bullets((f"{quant} winner: {outcome['command']}", *outcome.get("env", []))))
    return Section("tune", title, tuple(blocks))


def chapter(experiments: Sequence[Chapter]) -> Chapter:
    """The chapter: the sections and figures of `experiments` (the report parts placed within it,
    in the registry's order), then the tune's."""

    def sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
        own = (section for part in experiments for section in part.sections(analysis, plots))
        return (*own, tune_section(analysis, plots))

    return Chapter(sections, (*(figure for part in experiments for figure in part.figures), TUNE_FIGURE))
