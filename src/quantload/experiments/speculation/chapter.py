"""The speculation experiment's section of the server flags chapter: speculative decoding, its
verdict, one figure, the table and why a variant did not speculate."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.chapters.parts import Chapter, Plots, not_run_section, shown, value
from quantload.analysis.document import Block, Bullets, Paragraph, Section, Table
from quantload.analysis.plotting import PALETTE, Figure, new_figure, save_figure
from quantload.experiments.speculation.findings import findings_of

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


def _speculation_plot(analysis: Analysis, path: Path) -> Path | None:
    table = findings_of(analysis).table
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
    table = findings_of(analysis).table
    title = "Speculative decoding"
    if table.empty:
        return not_run_section(
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
        Paragraph(findings_of(analysis).verdict, "verdict"),
        *shown(plots, SPECULATION_FIGURE),
        Table(columns, rows, (False, False, False, *([True] * 8), False)),
    ]
    if not failed.empty:
        lines = tuple(dict.fromkeys(f"{r.variant}: {r.why}" for r in failed.itertuples()))
        blocks.append(Bullets(lines, "warning"))
    return Section("speculation", title, tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return (speculation_section(analysis, plots),)


CHAPTER = Chapter(_sections, (SPECULATION_FIGURE,))
