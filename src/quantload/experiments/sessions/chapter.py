"""The sessions experiment's chapter. Multi-turn sessions (one figure): TTFT and prompt tokens by
turn, with the prompt cache off and on, and each conversation's prefix-cache hit rate by slot
placement."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from quantload.analysis import fmt
from quantload.analysis.chapters.parts import Chapter, Plots, not_run_section, shown, value
from quantload.analysis.document import Block, Paragraph, Section, Table
from quantload.analysis.plotting import Figure, colors, new_figure, save_figure
from quantload.experiments.sessions.findings import findings_of

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


def _cache_label(cache_on: object) -> str:
    return "cache on" if bool(cache_on) else "cache off"


def _ttft_by_turn(analysis: Analysis, path: Path) -> Path | None:
    """TTFT p50 and prompt tokens by turn, one line per quantization and cache mode."""
    table = findings_of(analysis).turns
    if table.empty or table["ttft_p50_s"].dropna().empty:
        return None
    figure, axes = new_figure(10.0, 4.2, 1, 2)
    palette = colors(analysis.quants)
    for (quant, cache_on), group in table.groupby(["quant", "cache_prompt"], sort=False):
        style = "-o" if cache_on else "--s"
        turns = [int(t) for t in group["turn"]]
        label = f"{quant} {_cache_label(cache_on)}"
        axes[0][0].plot(turns, group["ttft_p50_s"] * 1000, style, color=palette.get(str(quant)), label=label)
        axes[0][1].plot(turns, group["prompt_tokens_p50"], style, color=palette.get(str(quant)), label=label)
    axes[0][0].set_ylabel("TTFT p50 (ms)")
    axes[0][1].set_ylabel("prompt tokens p50 (whole history)")
    for axis in axes[0]:
        axis.set_xlabel("turn (0 = first)")
        axis.set_xticks(sorted({int(t) for t in table["turn"]}))
        axis.grid(True, alpha=0.3)
        axis.set_ylim(bottom=0)
        axis.legend(fontsize=8)
    figure.suptitle("Multi-turn conversations: each turn resends the whole history")
    return save_figure(figure, path)


FIGURES = (Figure("ttft_by_turn", "TTFT and prompt tokens by turn", _ttft_by_turn),)


def sessions_section(analysis: Analysis, plots: Plots) -> Section:
    """TTFT and prompt tokens by turn, and each conversation's prefix-cache hit rate."""
    found = findings_of(analysis)
    turns, summary = found.turns, found.hit_summary
    if turns.empty:
        return not_run_section(
            "sessions", "Multi-turn sessions", "no complete sessions stage (the sessions experiment)"
        )
    blocks: list[Block] = [
        Paragraph(
            "Each conversation sends its whole history every turn: the earlier user turns, the"
            " server's actual replies and a new user turn, after a think time. With cache_prompt on,"
            " llama-server can reuse the history it already computed (timings.cache_n); off, it"
            " prefills the whole history again, so TTFT grows with every turn."
        ),
        *shown(plots, FIGURES[0]),
    ]
    rows = tuple(
        (
            str(r["quant"]),
            _cache_label(r["cache_prompt"]),
            str(r["turn"]),
            f"{r['ok']} / {r['requests']}",
            fmt.duration(value(r["ttft_p50_s"])),
            fmt.duration(value(r["ttft_p99_s"])),
            fmt.duration(value(r["prefill_p50_s"])),
            fmt.number(value(r["prompt_tokens_p50"]), 0),
            fmt.percent(value(r["cache_hit_frac"]), 0),
        )
        for r in turns.to_dict("records")
    )
    columns = ("quant", "cache", "turn", "ok / sent", "TTFT p50", "TTFT p99", "prefill p50",
               "prompt tokens p50", "from cache")  # fmt: skip
    blocks.append(
        Table(
            columns,
            rows,
            (False, False, True, True, True, True, True, True, True),
            "TTFT and prompt tokens by turn",
        )
    )
    if not summary.empty:
        hit_rows = tuple(
            (
                str(r["quant"]),
                _cache_label(r["cache_prompt"]),
                "id_slot (pinned)" if r["pinned"] else "server's choice (-sps)",
                str(r["sessions"]),
                _hit_range(r),
                str(r["lost_cache"]),
            )
            for r in summary.to_dict("records")
        )
        blocks.append(
            Table(
                (
                    "quant",
                    "cache",
                    "slot placement",
                    "conversations",
                    "hit rate p50 (min–max)",
                    "lost their cache",
                ),
                hit_rows,
                (False, False, False, True, True, True),
                "Prefix-cache hit rate per conversation: prompt tokens of turns 1 on that came from the cache"
                " (timings.cache_n); 'lost their cache' counts conversations under 10 %.",
            )
        )
    return Section("sessions", "Multi-turn sessions", tuple(blocks))


def _hit_range(row: dict[str, object]) -> str:
    """'62 % (48–70 %)': a hit-rate median and its range over conversations."""
    middle = value(row["hit_frac_p50"])
    low, high = value(row["hit_frac_min"]), value(row["hit_frac_max"])
    if middle is None:
        return fmt.DASH
    if low is None or high is None:
        return fmt.percent(middle, 0)
    return f"{fmt.percent(middle, 0)} ({fmt.percent(low, 0)}{fmt.DASH}{fmt.percent(high, 0)})"


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return (sessions_section(analysis, plots),)


CHAPTER = Chapter(_sections, FIGURES)
