"""The noisy neighbour's chapter. Tenants sharing a server: per tenant its latency, goodput and
failed share against its own SLO; the noisy neighbour (one figure): the others' TTFT p99 and
goodput against the neighbour's load, the fairness index, the load at which another tenant breaks
its SLO, and what a server per tenant would cost instead."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantload.analysis import fmt
from quantload.analysis.chapters.parts import Chapter, Plots, gap_blocks, not_run_section, shown, value
from quantload.analysis.document import Bullets, Paragraph, Section, Table
from quantload.analysis.plotting import PALETTE, Figure, new_figure, save_figure
from quantload.experiments.noisy_neighbour.findings import findings_of
from quantload.experiments.noisy_neighbour.tables import IsolationCost

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


def _neighbour_axis(analysis: Analysis) -> str:
    settings = analysis.run.settings
    neighbour = settings.neighbour_tenant if settings is not None else None
    if neighbour is None:
        return "the neighbour's load"
    unit = "requests/s" if neighbour.open_loop else "users"
    return f"{neighbour.name}'s load ({unit})"


def _noisy_figure(analysis: Analysis, path: Path) -> Path | None:
    """Each tenant's TTFT p99 and goodput, and the fairness index, against the neighbour's load."""
    table = findings_of(analysis).steps
    if table.empty or table["ttft_p99_s"].dropna().empty:
        return None
    figure, axes = new_figure(13.0, 4.0, 1, 3)
    names = list(dict.fromkeys(table["tenant"]))
    styles = ("-o", "--s", ":^", "-.d")
    for q_index, (quant, group) in enumerate(table.groupby("quant", sort=False)):
        for t_index, tenant in enumerate(names):
            mine = group[group["tenant"] == tenant].sort_values("step")
            if mine.empty:
                continue
            color = PALETTE[t_index % len(PALETTE)]
            style = styles[q_index % len(styles)]
            label = f"{tenant} ({quant})"
            axes[0][0].plot(mine["step"], mine["ttft_p99_s"] * 1000, style, color=color, label=label)
            axes[0][1].plot(mine["step"], mine["goodput_rps"], style, color=color, label=label)
            limit = mine["slo_ttft_s"].dropna()
            if not limit.empty and q_index == 0:
                axes[0][0].axhline(float(limit.iloc[0]) * 1000, color=color, linestyle=":", linewidth=1)
        steps = group.drop_duplicates("step").sort_values("step")
        axes[0][2].plot(
            steps["step"], steps["fairness_index"], styles[q_index % len(styles)], label=str(quant)
        )
    axes[0][0].set_ylabel("TTFT p99 (ms; dotted: its SLO)")
    axes[0][1].set_ylabel("goodput (good requests/s)")
    axes[0][2].set_ylabel("Jain's fairness index")
    axes[0][2].set_ylim(0, 1.05)
    for axis in axes[0]:
        axis.set_xlabel(_neighbour_axis(analysis))
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=8)
    axes[0][0].set_ylim(bottom=0)
    axes[0][1].set_ylim(bottom=0)
    figure.suptitle("The noisy neighbour: the others' latency and goodput as one tenant steps up")
    return save_figure(figure, path)


FIGURES = (Figure("noisy_neighbour", "The noisy neighbour: latency, goodput and fairness", _noisy_figure),)


def tenants_section(analysis: Analysis) -> Section:
    """Per tenant and stage: TTFT/TPOT p50/p99, goodput, failed share, its SLO verdict."""
    table = findings_of(analysis).tenants
    if table.empty:
        return not_run_section("tenants", "Tenants", "no stage was shared by tenants ([[tenants]])")
    rows = tuple(
        (
            str(r["quant"]),
            str(r["phase"] or r["experiment"]),
            str(r["tenant"]),
            f"{r['ok']} / {r['requests']}",
            fmt.percent(value(r["failed_frac"]), 1),
            fmt.duration(value(r["ttft_p50_s"])),
            fmt.duration(value(r["ttft_p99_s"])),
            fmt.duration(value(r["tpot_p50_s"])),
            fmt.duration(value(r["tpot_p99_s"])),
            fmt.number(value(r["goodput_rps"]), 2),
            f"{fmt.duration(value(r['slo_ttft_s']))} / {fmt.duration(value(r['slo_tpot_s']))}",
            "–" if r["outcome"] == "unjudged" else str(r["outcome"]),
        )
        for r in table.to_dict("records")
    )
    columns = (
        "quant", "stage", "tenant", "ok / requests", "failed", "TTFT p50", "TTFT p99", "TPOT p50", "TPOT p99",
        "goodput (req/s)", "its SLO (TTFT / TPOT)", "verdict",
    )  # fmt: skip
    caption = (
        "Each tenant's own records of each stage, judged against its own SLO (quantload.slo: goodput is"
        " requests that succeeded within their deadline and both limits); an open-loop tenant's TTFT"
        " counts from the intended send time."
    )
    return Section(
        "tenants",
        "Tenants",
        (Table(columns, rows, (False, False, False, *([True] * 8), False), caption, "tenant-table"),),
    )


def _isolation_sentence(cost: IsolationCost, step_words: str) -> str:
    if cost.isolated_servers is None:
        return f"A server per tenant cannot be sized: {cost.why}."
    each = ", ".join(f"{name} {count}" for name, count in cost.per_tenant.items())
    shared = (
        "every tenant held its SLO on the 1 shared server the run measured"
        if cost.shared_held
        else "the 1 shared server the run measured did not keep every tenant within its SLO"
    )
    text = (
        f"With {step_words}, {shared}; a server per tenant would take {cost.isolated_servers} ({each}),"
        f" sized by {cost.why}"
    )
    if cost.price_per_hour is not None:
        isolated = cost.price_per_hour * cost.isolated_servers
        shared_cost = cost.price_per_hour * cost.shared_servers
        text += f": {isolated:,.2f} {cost.currency} an hour against {shared_cost:,.2f}".rstrip()
    return text + "."


def noisy_section(analysis: Analysis, plots: Plots) -> Section:
    """The others' figures per neighbour load, the fairness index, the verdict, isolation's cost."""
    found = findings_of(analysis)
    table = found.steps
    if table.empty:
        return not_run_section(
            "noisy-neighbour", "The noisy neighbour", "no complete noisy_neighbour stage", analysis, "tenants"
        )
    settings = analysis.run.settings
    neighbour = settings.neighbour_tenant if settings is not None else None
    blocks = [
        Paragraph(
            "Every tenant sends at its own load in the same stages while one of them steps its load up"
            f" ({_neighbour_axis(analysis)}; 0 = the others alone). llama-server has no priorities: each"
            " tenant keeps its own concurrency on the client side, and the server serves whatever"
            " arrives. The others' figures count their requests sent while the neighbour was sending."
            " Fairness is Jain's index of each tenant's share of the tokens served against its share of"
            " the streams it kept busy (times its weight): 1 = served in proportion, 1/n = one tenant"
            " got everything."
        ),
        Bullets(tuple(verdict.sentence for verdict in found.verdicts), "verdict"),
        *shown(plots, FIGURES[0]),
    ]
    for verdict in found.verdicts:
        if verdict.isolation is not None and neighbour is not None:
            unit = "req/s" if neighbour.open_loop else "users"
            step_words = f"{neighbour.name} at {verdict.isolation.step:g} {unit}"
            blocks.append(
                Paragraph(f"{verdict.quant}: " + _isolation_sentence(verdict.isolation, step_words))
            )
    rows = tuple(
        (
            str(r["quant"]),
            f"{r['step']:g}",
            str(r["tenant"]) + (" (neighbour)" if r["neighbour"] else ""),
            f"{r['ok']} / {r['requests']}",
            fmt.duration(value(r["ttft_p50_s"])),
            fmt.duration(value(r["ttft_p99_s"])),
            fmt.duration(value(r["tpot_p99_s"])),
            fmt.number(value(r["goodput_rps"]), 2),
            fmt.percent(value(r["failed_frac"]), 1),
            fmt.number(value(r["service_share_over_demand"]), 2),
            fmt.number(value(r["fairness_index"]), 3),
            "–" if r["outcome"] == "unjudged" else str(r["outcome"]),
        )
        for r in table.to_dict("records")
    )
    columns = (
        "quant", "neighbour load", "tenant", "ok / counted", "TTFT p50", "TTFT p99", "TPOT p99",
        "goodput (req/s)", "failed", "service / demand share", "fairness (Jain)", "its SLO",
    )  # fmt: skip
    caption = "Repeats of a step pooled; a step's fairness index is the median over its repeats."
    blocks.append(Table(columns, rows, (False, True, False, *([True] * 8), False), caption, "noisy-table"))
    blocks += gap_blocks(analysis, "tenants")
    return Section("noisy-neighbour", "The noisy neighbour", tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return tenants_section(analysis), noisy_section(analysis, plots)


CHAPTER = Chapter(_sections, FIGURES)
