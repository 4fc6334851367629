"""The server's flags by measurement: continuous against static batching (1 figure), slots at a
fixed KV budget (1 figure), speculative decoding (1 figure) and `quantload tune` (1 figure), each
with its one-sentence verdict."""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.chapters.parts import Chapter, Plots, not_run_section, shown, value
from quantload.analysis.document import Block, Bullets, Paragraph, Section, Table
from quantload.analysis.plotting import PALETTE, Figure, colors, new_figure, save_figure


def _not_run(key: str, title: str, what: str) -> Section:
    return not_run_section(key, title, what)


# ----------------------------------------------------------------------------- batching


def _batching_plot(analysis: Analysis, path: Path) -> Path | None:
    table = analysis.server_flags.batching
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
    table = analysis.server_flags.batching
    title = "Continuous against static batching"
    if table.empty:
        return _not_run("batching", title, "no complete stage of the batching experiment (load.experiments)")
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
        Paragraph(analysis.server_flags.batching_verdict, "verdict"),
        *shown(plots, BATCHING_FIGURE),
        Table(columns, rows, (False, False, False, *([True] * 11))),
    ]
    return Section("batching", title, tuple(blocks))


# ----------------------------------------------------------------------------- slots


def _slots_plot(analysis: Analysis, path: Path) -> Path | None:
    table = analysis.server_flags.slots
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
    table = analysis.server_flags.slots
    title = "Slots at a fixed KV budget"
    if table.empty:
        return _not_run("slots", title, "no limit search of the slots experiment (load.experiments)")
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
            Paragraph(analysis.server_flags.slots_verdict, "verdict"),
            *shown(plots, SLOTS_FIGURE),
            Table(columns, rows, (False, *([True] * 11))),
        ),
    )


# ----------------------------------------------------------------------------- speculation


def _speculation_plot(analysis: Analysis, path: Path) -> Path | None:
    table = analysis.server_flags.speculation
    measured = table[table["variant"] != "spec off"] if not table.empty else table
    if measured.empty or measured["decode_speedup"].dropna().empty:
        return None
    cells = list(dict.fromkeys(zip(measured["traffic"], measured["users"], strict=True)))
    variants = list(dict.fromkeys(measured["variant"]))
    figure, axes = new_figure(10.0, 4.0)
    axis = axes[0][0]
    width = 0.8 / max(1, len(variants))
    for offset, variant in enumerate(variants):
        heights = []
        for traffic, users in cells:
            row = measured[
                (measured["variant"] == variant)
                & (measured["traffic"] == traffic)
                & (measured["users"] == users)
            ]
            heights.append(value(row["decode_speedup"].median()) or 0.0 if not row.empty else 0.0)
            if not row.empty and row["speculating"].eq(False).any():  # shown as what it is, not as a bar
                x = len(heights) - 1 + offset * width
                axis.text(x, 0.05, "not speculating", rotation=90, fontsize=7, ha="center", va="bottom")
        axis.bar(
            [i + offset * width for i in range(len(cells))],
            heights,
            width=width,
            color=PALETTE[offset % len(PALETTE)],
            label=variant.removeprefix("spec "),
        )
    axis.axhline(1.0, color="black", linewidth=0.8)
    labels = [f"{t}\n{fmt.counted(u, 'user')}" for t, u in cells]
    axis.set_xticks([i + 0.4 - width / 2 for i in range(len(cells))], labels)
    axis.set_ylabel("decode tok/s against speculation off (x)")
    axis.grid(True, axis="y", alpha=0.3)
    axis.legend(fontsize=8)
    figure.suptitle("Speculative decoding: decode speed-up by traffic and load (server's own timings)")
    return save_figure(figure, path)


SPECULATION_FIGURE = Figure("speculation", "Decode speed-up of each way of speculating", _speculation_plot)


def speculation_section(analysis: Analysis, plots: Plots) -> Section:
    table = analysis.server_flags.speculation
    title = "Speculative decoding"
    if table.empty:
        return _not_run(
            "speculation", title, "no complete stage of the speculation experiment (load.experiments)"
        )
    rows = tuple(
        (
            str(r["quant"]),
            str(r["variant"]).removeprefix("spec "),
            str(r["traffic"]),
            str(r["users"]),
            str(r["requests"]),
            fmt.duration(value(r["tpot_p50_s"])),
            fmt.number(value(r["decode_tok_s_p50"]), 1),
            "-"
            if r["decode_speedup"] is None or pd.isna(r["decode_speedup"])
            else f"x{r['decode_speedup']:.2f}",
            fmt.number(value(r["drafted_per_request"]), 1),
            fmt.percent(value(r["acceptance"]), 0),
            fmt.percent(value(r["server_acceptance"]), 0),
            "yes" if r["speculating"] else ("off" if r["speculating"] is None else f"NO: {r['why']}"),
        )
        for r in table.to_dict("records")
    )
    columns = (
        "quant",
        "speculation",
        "traffic",
        "users",
        "requests",
        "TPOT p50",
        "decode tok/s p50",
        "speed-up",
        "drafted per request",
        "accepted (timings)",
        "accepted (/metrics)",
        "speculating",
    )
    failed = table[table["speculating"].eq(False)]
    blocks: list[Block] = [
        Paragraph(
            "Each way of speculating is the server restarted with it: --spec-type none (off), an n-gram"
            " type (no draft model), a draft model of the same vocabulary (-md, --spec-type"
            " draft-simple) and, for benchmarking, synthetic acceptance (--spec-synth-len). 'repeat'"
            " traffic asks the model to repeat or lightly edit a given text (drafts from the prompt can be"
            " right); 'free' is the prompt set as it is. Decode tok/s is each request's completion tokens"
            " over the server's own predicted_ms; the speed-up is against speculation off on the same"
            " traffic at the same users. Acceptance is draft tokens accepted over drafted, from the"
            " requests' timings and from the server's /metrics counters."
        ),
        Paragraph(analysis.server_flags.speculation_verdict, "verdict"),
        *shown(plots, SPECULATION_FIGURE),
        Table(columns, rows, (False, False, False, *([True] * 8), False)),
    ]
    if not failed.empty:
        lines = tuple(dict.fromkeys(f"{r.variant}: {r.why}" for r in failed.itertuples()))
        blocks.append(Bullets(lines, "warning"))
    return Section("speculation", title, tuple(blocks))


# ----------------------------------------------------------------------------- tune


def _tune_plot(analysis: Analysis, path: Path) -> Path | None:
    trials = analysis.server_flags.tune.trials
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
        unit = "users" if analysis.server_flags.tune.objective != "rate" else "req/s"
        axis.set_ylabel(f"{quant}: limit ({unit})")
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    figure.suptitle("quantload tune: each configuration's limit by rung (later rungs: fewer, longer trials)")
    return save_figure(figure, path)


TUNE_FIGURE = Figure("tune", "The tune's trials: limit per configuration and rung", _tune_plot)


def tune_section(analysis: Analysis, plots: Plots) -> Section:
    tables = analysis.server_flags.tune
    title = "Tuned server flags"
    if tables.trials.empty:
        return _not_run("tune", title, "the run did not tune (run.tune, or quantload tune)")
    blocks: list[Block] = [
        Paragraph(
            "quantload tune searched the [tune] space of server flags by successive halving: every"
            " configuration got a short limit search first, the best of each rung a longer one, the"
            " finalists one with the limit search's repeats; goodput at the limit breaks ties. The"
            " configured flags were searched as the finalists were, for comparison."
        ),
        Paragraph(analysis.server_flags.tune_verdict, "verdict"),
        *shown(plots, TUNE_FIGURE),
    ]
    for quant, outcome in tables.outcomes.items():
        rows = tuple(
            (
                str(r["rank"]),
                str(r["key"]),
                str(r["rung"] + 1),
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


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return (
        batching_section(analysis, plots),
        slots_section(analysis, plots),
        speculation_section(analysis, plots),
        tune_section(analysis, plots),
    )


CHAPTER = Chapter(_sections, (BATCHING_FIGURE, SLOTS_FIGURE, SPECULATION_FIGURE, TUNE_FIGURE))
