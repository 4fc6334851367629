"""The load test's main results: latency and throughput against concurrency (three figures), the
capacity under the SLO with goodput and the limit search (one figure). The open loop's levels
(Poisson arrivals) follow, from the experiment's own folder under quantload.experiments."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.capacity import search_sentence, slo_text
from quantload.analysis.chapters.parts import (
    Chapter,
    Plots,
    interval_text,
    not_run_section,
    range_text,
    shown,
    value,
)
from quantload.analysis.document import Block, Bullets, Details, Paragraph, Section, Table
from quantload.analysis.plotting import (
    Figure,
    colors,
    column_values,
    error_bars,
    interval_bars,
    log_scale_if_wide,
    new_figure,
    save_figure,
    users_axis,
)
from quantload.analysis.prediction_check import PART_FRAC, TPOT_PART, TTFT_PART, prediction_checks
from quantload.experiments.registry import REGISTRY
from quantload.load.limit_search import level_text


def _ttft_vs_concurrency(analysis: Analysis, path: Path) -> Path | None:
    """TTFT p50 (solid) and p99 (dashed) against users, per quant, from each level's requests
    together; bars: their confidence intervals; hollow: a p99 the requests cannot bound above."""
    levels, slo = analysis.levels, analysis.slo
    if levels.empty or levels["ttft_p50_s"].dropna().empty:
        return None
    figure, axes = new_figure(8.0, 4.6)
    axis = axes[0][0]
    palette = colors(analysis.quants)
    plotted: list[float] = []
    for quant, frame in levels.groupby("quant", sort=False):
        users = [int(u) for u in frame["users"]]
        color = palette.get(str(quant))
        for metric, style, label in (("ttft_p50_s", "-o", "p50"), ("ttft_p99_s", "--s", "p99")):
            values = [v * 1000 for v in column_values(frame, metric)]
            plotted += values
            bars, unbounded = interval_bars(frame, metric, 1000)
            axis.errorbar(
                users, values, yerr=bars, fmt=style, capsize=3, color=color, label=f"{quant} {label}"
            )
            open_points = [(u, v) for u, v, no in zip(users, values, unbounded, strict=True) if no]
            if open_points:
                axis.plot(*zip(*open_points, strict=True), style[-1], color=color, markerfacecolor="white",
                          linestyle="none")  # fmt: skip
    axis.axhline(
        slo.ttft_s * 1000,
        color="black",
        linestyle=":",
        linewidth=1,
        label=f"SLO {slo.ttft_percentile} {slo.ttft_s * 1000:g} ms",
    )
    users_axis(axis, sorted({int(u) for u in levels["users"]}))
    log_scale_if_wide(axis, plotted)
    axis.set_ylabel("TTFT (ms)")
    axis.set_title(
        "Time to first token against concurrency (each level's requests together;"
        f" bars: {fmt.percent(slo.confidence, 0)} interval; hollow: no upper bound)",
        fontsize=9,
    )
    axis.legend(fontsize=8, ncols=2)
    return save_figure(figure, path)


def _throughput_vs_concurrency(analysis: Analysis, path: Path) -> Path | None:
    """Total output tokens/s against users, per quant."""
    levels = analysis.levels
    if levels.empty or levels["output_tok_s"].dropna().empty:
        return None
    figure, axes = new_figure(8.0, 4.2)
    axis = axes[0][0]
    palette = colors(analysis.quants)
    for quant, frame in levels.groupby("quant", sort=False):
        axis.errorbar(
            [int(u) for u in frame["users"]],
            column_values(frame, "output_tok_s"),
            yerr=error_bars(frame, "output_tok_s"),
            fmt="-o",
            capsize=3,
            color=palette.get(str(quant)),
            label=str(quant),
        )
    users_axis(axis, sorted({int(u) for u in levels["users"]}))
    axis.set_ylabel("output tokens/s (all users)")
    axis.set_ylim(bottom=0)
    axis.set_title("Throughput against concurrency (median of repeats, bars: min–max)")
    axis.legend(fontsize=8)
    return save_figure(figure, path)


def _latency_vs_throughput(analysis: Analysis, path: Path) -> Path | None:
    """TTFT and TPOT at the SLO's percentiles against output tokens/s: one curve per quant, points
    labelled by users."""
    levels, slo = analysis.levels, analysis.slo
    if levels.empty or levels["output_tok_s"].dropna().empty:
        return None
    figure, axes = new_figure(10.0, 4.4, 1, 2)
    palette = colors(analysis.quants)
    for axis, metric, limit, title in (
        (axes[0][0], "ttft_at_slo_s", slo.ttft_s, f"TTFT {slo.ttft_percentile} (ms)"),
        (axes[0][1], "tpot_at_slo_s", slo.tpot_s, f"TPOT {slo.tpot_percentile} (ms)"),
    ):
        for quant, frame in levels.groupby("quant", sort=False):
            x, y = column_values(frame, "output_tok_s"), [v * 1000 for v in column_values(frame, metric)]
            axis.plot(x, y, "-o", color=palette.get(str(quant)), label=str(quant))
            for xi, yi, users in zip(x, y, frame["users"], strict=True):
                if math.isfinite(xi) and math.isfinite(yi):
                    axis.annotate(
                        f"{int(users)}u", (xi, yi), textcoords="offset points", xytext=(4, 4), fontsize=7
                    )
        axis.axhline(limit * 1000, color="black", linestyle=":", linewidth=1, label="SLO")
        axis.set_xlabel("output tokens/s (all users)")
        axis.set_ylabel(title)
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    figure.suptitle("Latency against throughput (one curve per quantization; labels: concurrent users)")
    return save_figure(figure, path)


PANELS_PER_ROW = 4
SEARCHES = tuple(experiment.name for experiment in REGISTRY if experiment.searches)


MARKS = {"meets": ("o", "met"), "misses": ("x", "missed"), "undecided": ("s", "undecided")}


def limit_search_figure(analysis: Analysis) -> Any | None:
    """The limit searches as levels over time: one panel per quantization and kind of search, each
    trial a step at its level for as long as it sent, ended by its verdict's mark (met: dot,
    missed: cross, undecided: hollow square); whole users on the user axis; the limit found
    dotted; one legend for all, outside the panels."""
    searches = [line for line in analysis.limits if line.trials]
    if not searches:
        return None
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    order = {quant: index for index, quant in enumerate(analysis.quants)}
    searches.sort(key=lambda line: (line.kind != "users", order.get(line.quant, len(order)), line.unix_s))
    columns = min(len(searches), PANELS_PER_ROW)
    rows = math.ceil(len(searches) / columns)
    figure, axes = new_figure(max(6.5, 3.4 * columns), 2.9 * rows + 0.9, rows, columns)
    palette = colors(analysis.quants)
    for index, line in enumerate(searches):
        axis = axes[index // columns][index % columns]
        color = palette.get(line.quant)
        clock = 0.0
        for trial in line.trials:
            took = max(trial.seconds, 0.0)
            axis.plot([clock, clock + took], [trial.level, trial.level], "-", color=color, linewidth=2.2,
                      alpha=0.55, solid_capstyle="butt")  # fmt: skip
            marker = MARKS[trial.outcome][0]
            face = "none" if trial.outcome == "undecided" else color
            axis.plot([clock + took], [trial.level], marker, color=color, markerfacecolor=face, markersize=7)
            clock += took
        levels = [t.level for t in line.trials] + ([line.limit] if line.limit is not None else [])
        if line.limit is not None:
            axis.axhline(line.limit, color=color, linestyle=":", linewidth=1)
        axis.set_xlim(0, max(clock, 1.0) * 1.04)
        axis.set_ylim(0, max(levels) * 1.15 + (0.5 if line.kind == "users" else 0.0))
        if line.kind == "users":
            axis.yaxis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
        axis.set_xlabel("seconds into the search")
        axis.set_ylabel("concurrent users" if line.kind == "users" else "arrival rate (requests/s)")
        axis.grid(True, alpha=0.3)
        search = "most users" if line.kind == "users" else "highest rate"
        found = "no limit found" if line.limit is None else f"limit {level_text(line.limit, line.kind)}"
        trials = fmt.counted(len(line.trials), "trial")
        axis.set_title(f"{line.quant}: {search} ({found}, {trials})", fontsize=9)
    for index in range(len(searches), rows * columns):
        axes[index // columns][index % columns].set_visible(False)
    ink = "#444444"
    handles = [
        Line2D([], [], marker=marker, color=ink, markerfacecolor="none" if outcome == "undecided" else ink,
               linestyle="none", label=label)
        for outcome, (marker, label) in MARKS.items()
    ] + [Line2D([], [], color=ink, linestyle=":", label="the limit found")]  # fmt: skip
    figure.legend(handles=handles, loc="outside lower center", ncols=len(handles), fontsize=8, frameon=False)
    figure.suptitle("Limit searches: the level each trial held, and its verdict when it ended")
    return figure


def _limit_trials(analysis: Analysis, path: Path) -> Path | None:
    figure = limit_search_figure(analysis)
    return save_figure(figure, path) if figure is not None else None


FIGURES = (
    Figure("ttft_vs_concurrency", "TTFT p50 and p99 against concurrency", _ttft_vs_concurrency),
    Figure("throughput_vs_concurrency", "Output tokens/s against concurrency", _throughput_vs_concurrency),
    Figure("latency_vs_throughput", "Latency against throughput", _latency_vs_throughput),
)
LIMIT_FIGURE = Figure("limit_search", "The limit search's trials", _limit_trials)


def load_curves_section(analysis: Analysis, plots: Plots) -> Section:
    """TTFT, throughput and latency-throughput plots."""
    blocks: list[Block] = [*(block for figure in FIGURES for block in shown(plots, figure))]
    if not blocks:
        blocks.append(Paragraph("not measured: no complete concurrency-sweep stage to plot", "warning"))
    return Section("plots", "Latency and throughput under load", tuple(blocks))


def capacity_section(analysis: Analysis) -> Section:
    """Per level against the SLO, and goodput."""
    slo = analysis.slo
    rows = []
    for verdict in analysis.capacity:
        by_users = {
            int(r["users"]): r for r in analysis.levels.to_dict("records") if r["quant"] == verdict.quant
        }
        for check in verdict.checks:
            row = by_users.get(check.users, {})
            judged = {
                "unjudged": fmt.DASH, "meets": "meets", "misses": f"misses: {check.why}",
                "undecided": f"undecided: {check.why}",
            }[check.outcome]  # fmt: skip
            if check.sureness:
                judged += f"; {check.sureness}"
            rows.append(
                (
                    verdict.quant,
                    str(check.users),
                    interval_text(row, "ttft_at_slo_s"),
                    interval_text(row, "tpot_at_slo_s"),
                    fmt.percent(check.failed_frac),
                    fmt.percent(value(row.get("good_frac"))),
                    range_text(row, "goodput_rps", "number"),
                    range_text(row, "output_tok_s", "number"),
                    judged,
                )
            )
    blocks: list[Block] = [
        Paragraph(
            f"SLO: {slo_text(slo)}. A level is judged on the requests of its repeats together and"
            " decided as they arrive: it meets the SLO when the data show, at that confidence, that no"
            " more than the allowed share of requests failed or was over each limit; it misses when they"
            " show more; otherwise it is undecided (its budget, slo.level_max_requests and"
            " slo.level_max_s, ran out first) and says about how many more requests would decide it."
            " Slow requests that come in bursts count for what their bursts are worth. The capacity is"
            " the highest level that meets with every lower level meeting too; no capacity rests on an"
            " undecided level, and the limit search judges each trial the same way. Percentiles come"
            f" from the level's requests together, with their {fmt.percent(slo.confidence, 0)}"
            " distribution-free confidence interval in brackets ('…': a side the requests cannot bound)."
            " Goodput counts the requests that succeeded within their deadline and met both limits on"
            " their own, per second of the stage (open loop, Poisson or trace: TTFT from the intended"
            " send time)."
        ),
        Bullets(tuple(v.sentence for v in analysis.capacity), "verdict"),
    ]
    if rows:
        columns = (
            "quant",
            "users",
            f"TTFT {slo.ttft_percentile}",
            f"TPOT {slo.tpot_percentile}",
            "failed",
            "good requests",
            "goodput req/s",
            "output tok/s",
            "SLO",
        )
        blocks.append(Table(columns, tuple(rows), (False, True, True, True, True, True, True, True, False)))
    return Section("capacity", "Capacity under the SLO (goodput)", tuple(blocks))


def prediction_section(analysis: Analysis) -> Section:
    """Each file's limit and latencies as predicted before the load, beside what the load measured."""
    title = "Predicted before the load, and measured"
    checks = prediction_checks(
        analysis.run, analysis.levels, analysis.capacity, analysis.quants, analysis.slo
    )
    if not checks:
        return not_run_section("prediction", title, "the run made no prediction (predict.enabled)")
    slo = analysis.slo
    blocks: list[Block] = [
        Paragraph(
            "Before serving, each file's cost curves were measured with llama-batched-bench and the"
            " server's flags, and a model of llama-server's scheduler predicted the most users within"
            " the SLO (the interval: the same levels under the slowest and the fastest cost the curves'"
            " error allows) and each level's latencies. A measured value parts from the prediction when it"
            f" exceeds both that interval and the prediction by more than {fmt.percent(PART_FRAC, 0)};"
            f" {TTFT_PART} is the model's queueing and prompt processing, {TPOT_PART} its decode step."
        ),
        Bullets(tuple(f"{check.quant}: {check.sentence}" for check in checks), "verdict"),
    ]
    findings = [f"{check.quant}: {check.finding}" for check in checks if check.finding]
    if findings:
        blocks.append(Bullets(tuple(findings), "warning"))
    rows = tuple(
        (
            check.quant,
            str(level.users),
            fmt.duration(level.predicted_ttft_s),
            fmt.duration(level.measured_ttft_s),
            fmt.duration(level.predicted_tpot_s),
            fmt.duration(level.measured_tpot_s),
            fmt.percent(level.queue_share, 0),
            fmt.percent(level.prefill_share, 0),
            fmt.percent(level.decode_share, 0),
            ", ".join(part for part, flag in ((TTFT_PART, level.ttft_parts), (TPOT_PART, level.tpot_parts))
                      if flag) or "no",
        )
        for check in checks
        for level in check.levels
    )  # fmt: skip
    if rows:
        columns = (
            "quant", "users", f"TTFT {slo.ttft_percentile} predicted", "measured",
            f"TPOT {slo.tpot_percentile} predicted", "measured", "queue", "prefill", "decode", "parts",
        )  # fmt: skip
        caption = "Sweep levels both predicted and measured; queue, prefill and decode: the predicted shares."
        blocks.append(Table(columns, rows, (False, *([True] * 8), False), caption))
    partings = [f"{check.quant}: {check.parting}" for check in checks if check.parting]
    notes = [f"{check.quant}: {check.slo_note}" for check in checks if check.slo_note]
    if partings:
        blocks.append(Bullets(tuple(partings)))
    if notes:
        blocks.append(Bullets(tuple(notes), "muted"))
    return Section("prediction", title, tuple(blocks))


def limit_section(analysis: Analysis, plots: Plots) -> Section:
    """What each limit search found, how long it took, and its trials."""
    title = "Finding the limit"
    if not analysis.limits:
        return not_run_section("limit", title, f"no limit search in this run ({', '.join(SEARCHES)})")
    def level(found: float | None, kind: str) -> str:
        return fmt.DASH if found is None else fmt.number(found, 0 if kind == "users" else 2)

    rows = tuple(
        (
            line.quant,
            "most users" if line.kind == "users" else "highest rate",
            line.workload,
            level(line.limit, line.kind),
            ", ".join(level(x, line.kind) for x in line.undecided) or fmt.DASH,
            level(line.lowest_miss, line.kind),
            line.ending,
            str(len(line.trials)),
            fmt.duration(line.seconds),
        )
        for line in analysis.limits
    )
    columns = (
        *("quant", "search", "workload", "limit (meets)", "undecided"),
        *("misses from", "ended", "trials", "took"),
    )
    blocks: list[Block] = [
        Paragraph(
            "Instead of judging only the levels it was given, the search grows the load geometrically"
            " until a level does not meet the SLO, bisects between the last level that met and the first"
            " that did not (to one user, or to the rate resolution), and, where that one was undecided,"
            " grows on until a level misses. Every trial is decided as it goes, like a sweep level: it"
            " sends until the data show it meets or misses the SLO, or its budget ends (undecided). The"
            " limit is the highest level that met with every level tried below it meeting. A trial that"
            " fails hard (a circuit breaker, a stage timeout, many errors) misses at once, and a time"
            " cap bounds the whole search."
        ),
        Bullets(tuple(f"{line.quant}: {search_sentence(line)}." for line in analysis.limits), "verdict"),
        Table(columns, rows, (False, False, False, True, True, True, False, True, True)),
        *shown(plots, LIMIT_FIGURE),
    ]
    trial_rows = tuple(
        (
            line.quant,
            line.kind,
            str(index + 1),
            fmt.number(trial.level, 0 if line.kind == "users" else 2),
            "misses (hard failure)" if trial.hard_failure else trial.outcome,
            trial.why,
            trial.sureness or (f"rests on {trial.requests} requests" if trial.requests else fmt.DASH),
            fmt.duration(trial.seconds),
        )
        for line in analysis.limits
        for index, trial in enumerate(line.trials)
    )
    blocks.append(
        Details(
            fmt.counted(len(trial_rows), "trial"),
            (Table(("quant", "search", "trial", "level", "verdict", "why", "how sure", "took"), trial_rows),),
        )
    )
    return Section("limit", title, tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return (
        load_curves_section(analysis, plots),
        capacity_section(analysis),
        prediction_section(analysis),
        limit_section(analysis, plots),
    )


CHAPTER = Chapter(_sections, (*FIGURES, LIMIT_FIGURE))
