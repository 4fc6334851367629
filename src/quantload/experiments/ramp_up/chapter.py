"""The ramp-up's chapter: per quantization the SLO's first break (or how far it held, or from where
it is undecided), one figure (TTFT at the SLO's percentile per step, with its interval and the
limit), and one table of the steps."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantload.analysis import fmt
from quantload.analysis.chapters.parts import Chapter, Plots, gap_blocks, not_run_section, shown, value
from quantload.analysis.document import Block, Bullets, Paragraph, Section, Table
from quantload.analysis.plotting import Figure, colors, column_values, interval_bars, new_figure, save_figure
from quantload.experiments.ramp_up.findings import findings_of
from quantload.experiments.ramp_up.tables import INCOMPLETE, RampRun

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis

SECTION = "ramp-up"
TITLE = "Ramp-up"


def _ramp_figure(analysis: Analysis, path: Path) -> Path | None:
    """TTFT at the SLO's percentile per step against its users, with its interval, per ramp; the
    steps that miss marked; the limit as a line."""
    runs = [run for run in findings_of(analysis).runs if not run.steps["ttft_at_slo_s"].dropna().empty]
    if not runs:
        return None
    slo = analysis.slo
    figure, axes = new_figure(8.0, 4.5)
    axis = axes[0][0]
    palette = colors([run.quant for run in runs])
    for run in runs:
        steps = run.steps
        bars, _ = interval_bars(steps, "ttft_at_slo_s", 1000.0)
        ttft = [v * 1000 for v in column_values(steps, "ttft_at_slo_s")]
        color = palette.get(run.quant)
        axis.errorbar(list(steps["users"]), ttft, yerr=bars, fmt="-o", ms=4, capsize=3, color=color,
                      label=f"{run.quant or run.server}")  # fmt: skip
        missed = steps["outcome"] == "misses"
        if missed.any():
            axis.plot(list(steps["users"][missed]), [t for t, m in zip(ttft, missed, strict=True) if m], "x",
                      ms=10, mew=2, color="#d62728")  # fmt: skip
    axis.axhline(slo.ttft_s * 1000, color="#555555", linestyle="--", linewidth=1,
                 label=f"TTFT {slo.ttft_percentile} limit")  # fmt: skip
    from matplotlib.ticker import MaxNLocator

    axis.xaxis.set_major_locator(MaxNLocator(integer=True))  # users are whole
    axis.set_xlabel("closed-loop users (one step each)")
    axis.set_ylabel(f"TTFT {slo.ttft_percentile} (ms; x: misses the SLO)")
    axis.set_ylim(bottom=0)
    axis.grid(True, alpha=0.3)
    axis.legend(fontsize=8)
    figure.suptitle(f"Ramp-up: TTFT {slo.ttft_percentile} as users grow, with its confidence interval")
    return save_figure(figure, path)


FIGURES = (Figure("ramp_up", "Ramp-up: TTFT at the SLO's percentile per step", _ramp_figure),)


def _verdict_text(outcome: object, why: object) -> str:
    if outcome == INCOMPLETE:
        return f"{INCOMPLETE}: {why}"
    return "–" if outcome == "unjudged" else str(outcome)


def step_table(run: RampRun, analysis: Analysis) -> Table:
    """Each step of one ramp: its users, requests, TTFT and TPOT at the SLO's percentiles with
    their intervals, its verdict."""
    slo = analysis.slo
    rows = tuple(
        (
            str(r["step"]),
            str(r["users"]),
            f"{int(value(r['ok']) or 0)} / {int(value(r['requests']) or 0)}",
            fmt.with_interval(value(r["ttft_at_slo_s"]), r["ttft_at_slo_s_ci"]),
            fmt.with_interval(value(r["tpot_at_slo_s"]), r["tpot_at_slo_s_ci"]),
            _verdict_text(r["outcome"], r["why"]),
        )
        for r in run.steps.to_dict("records")
    )
    columns = (
        "step", "users", "ok / requests", f"TTFT {slo.ttft_percentile}", f"TPOT {slo.tpot_percentile}",
        "verdict",
    )  # fmt: skip
    caption = (
        f"{run.quant or run.server}: each step's percentiles from its requests, in brackets their"
        f" {fmt.percent(slo.confidence, 0)} confidence interval ('…': a side its requests cannot bound);"
        " the verdict is the SLO's, as every sweep level gets it."
    )
    return Table(columns, rows, (True, True, True, True, True, False), caption, f"ramp-up-{run.quant}")


def ramp_section(analysis: Analysis, plots: Plots) -> Section:
    """Where each quantization's SLO first breaks, the figure, and every step."""
    runs = findings_of(analysis).runs
    if not runs:
        return not_run_section(SECTION, TITLE, "no ramp-up in this run (-e ramp_up)", analysis, "ramp_up")
    blocks: list[Block] = [
        Paragraph(
            "Closed-loop users grown by one a step (ramp_up.step_s each), every step judged against"
            " the SLO as it ends; the ramp stops after the first step that misses. A step's users"
            " send again and again until its time is up, then its last requests finish."
        ),
        Bullets(tuple(f"{run.quant or run.server}: {run.sentence}" for run in runs), "verdict"),
        *shown(plots, FIGURES[0]),
    ]
    blocks += [step_table(run, analysis) for run in runs]
    blocks += gap_blocks(analysis, "ramp_up")
    return Section(SECTION, TITLE, tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    asked = findings_of(analysis).runs or any(gap.section == "ramp_up" for gap in analysis.gaps)
    return (ramp_section(analysis, plots),) if asked else ()  # no ramp asked for: no section


CHAPTER = Chapter(_sections, FIGURES)
