"""The context experiment's chapter. Conversations that outgrow the slot context: per policy (the
server refuses, the client trims, the server shifts) where conversations met the slot, how many
completed, the cache hit rate before and after, and TTFT and prompt tokens by turn (one figure)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from quantload.analysis import fmt
from quantload.analysis.chapters.parts import Chapter, Plots, gap_blocks, not_run_section, shown, value
from quantload.analysis.document import Bullets, Paragraph, Section, Table
from quantload.analysis.plotting import Figure, colors, new_figure, save_figure
from quantload.experiments.context.findings import findings_of
from quantload.experiments.context.stages import NAME
from quantload.experiments.context.tables import EVENT_WORDS

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis

POLICY_STYLE = {"fail": "-o", "trim": "--s", "shift": ":^"}
POLICY_TEXT = {
    "fail": "the server's default: the turn that does not fit is refused (HTTP 400)",
    "trim": "the client keeps the system prompt and the latest turns that fit",
    "shift": "the server runs with --context-shift and --keep",
}


def _by_turn(analysis: Analysis, path: Path) -> Path | None:
    """TTFT p50 and prompt tokens p50 by turn, one line per quantization and policy."""
    table = findings_of(analysis).turns
    if table.empty or table["ttft_p50_s"].dropna().empty:
        return None
    figure, axes = new_figure(10.0, 4.2, 1, 2)
    palette = colors(analysis.quants)
    for (quant, policy), group in table.groupby(["quant", "policy"], sort=False):
        ok = group[group["ok"] > 0]
        style = POLICY_STYLE.get(str(policy), "-")
        label = f"{quant} {policy}"
        turns = [int(t) for t in ok["turn"]]
        axes[0][0].plot(turns, ok["ttft_p50_s"] * 1000, style, color=palette.get(str(quant)), label=label)
        axes[0][1].plot(turns, ok["prompt_tokens_p50"], style, color=palette.get(str(quant)), label=label)
    slots = analysis.stages.loc[analysis.stages["experiment"] == NAME, "slot_context_tokens"].dropna()
    if not slots.empty:
        axes[0][1].axhline(
            float(slots.iloc[0]), color="grey", linestyle="--", linewidth=1, label="slot context"
        )
    axes[0][0].set_ylabel("TTFT p50 (ms)")
    axes[0][1].set_ylabel("prompt tokens p50 (as sent)")
    for axis in axes[0]:
        axis.set_xlabel("turn (0 = first)")
        axis.grid(True, alpha=0.3)
        axis.set_ylim(bottom=0)
        axis.legend(fontsize=8)
    figure.suptitle("Conversations beyond the slot: refused, trimmed or shifted")
    return save_figure(figure, path)


FIGURES = (Figure("context_by_turn", "TTFT and prompt tokens by turn, per context policy", _by_turn),)


def _turn_range(row: dict[str, Any]) -> str:
    median = value(row.get("event_turn_p50"))
    if median is None:
        return "none"
    low, high = value(row.get("event_turn_min")), value(row.get("event_turn_max"))
    if low is None or high is None or low == high:
        return f"turn {median:g}"
    return f"turns {low:g}–{high:g} (median {median:g})"


def _policy_sentence(row: dict[str, Any]) -> str:
    policy = str(row["policy"])
    done, total = int(row["completed"]), int(row["conversations"])
    text = f"{row['quant']}, {policy}: {done} of {total} conversations completed"
    if int(row["with_event"]):
        text += f"; {EVENT_WORDS.get(policy, 'met the slot')} at {_turn_range(row)}"
    if policy in ("fail", "shift") and value(row.get("refused_prompt_tokens")) is not None:
        text += (
            f"; refused as llama-server said: {value(row['refused_prompt_tokens']):,.0f} prompt tokens for"
            f" a {value(row['refused_n_ctx']):,.0f}-token slot (context_exceeded)"
        )
    if policy == "shift" and value(row.get("refused_turn_p50")) is not None:
        text += f", the turn after the shift refused all the same (turn {value(row['refused_turn_p50']):g})"
    before, after = value(row.get("hit_frac_before")), value(row.get("hit_frac_after"))
    if before is not None or after is not None:
        text += f"; cache hit {fmt.percent(before, 0)} before"
        text += f", {fmt.percent(after, 0)} after" if after is not None else ", no later turn to reuse it"
    cut = int(row.get("truncated_replies") or 0)
    if cut:
        text += f"; {cut} repl{'y' if cut == 1 else 'ies'} stopped short where the slot filled (truncated)"
    return text + "."


def context_section(analysis: Analysis, plots: Plots) -> Section:
    """Per policy: completed conversations, where they met the slot, the hit rate; then by turn."""
    found = findings_of(analysis)
    policies, turns = found.policies, found.turns
    if policies.empty:
        return not_run_section(
            "contexts", "Conversations beyond the slot context",
            "no complete context stage (the context experiment)", analysis, "contexts",
        )  # fmt: skip
    slot = analysis.stages.loc[analysis.stages["experiment"] == NAME, "slot_context_tokens"].dropna()
    slot_text = f"{int(slot.iloc[0]):,}-token slots" if not slot.empty else "the server's slots"
    blocks = [
        Paragraph(
            f"Every conversation sends its whole history each turn, so it outgrows {slot_text} somewhere"
            " along the way. Policies: "
            + "; ".join(f"{name}: {text}" for name, text in POLICY_TEXT.items())
            + ". The event is where a conversation first met the slot: the refused turn (fail), the"
            " first trimmed turn (trim), the first shifted reply (shift). Cache hit = the share of"
            " later turns' prompt tokens the server found cached (timings.cache_n), before the event"
            " and from it on."
        ),
        Bullets(tuple(_policy_sentence(row) for row in policies.to_dict("records")), "verdict"),
        *shown(plots, FIGURES[0]),
    ]
    rows = tuple(
        (
            str(r["quant"]),
            str(r["policy"]),
            str(r["turn"]),
            f"{r['ok']} / {r['requests']}",
            str(r["refused"]),
            str(r["truncated"]),
            str(r["shifted"]),
            str(r["trimmed"]),
            fmt.duration(value(r["ttft_p50_s"])),
            fmt.duration(value(r["ttft_p99_s"])),
            fmt.number(value(r["prompt_tokens_p50"]), 0),
            fmt.percent(value(r["cache_hit_frac"]), 0),
        )
        for r in turns.to_dict("records")
    )
    columns = (
        "quant", "policy", "turn", "ok / sent", "refused", "truncated", "shifted", "trimmed", "TTFT p50",
        "TTFT p99", "prompt tokens p50", "cache hit",
    )  # fmt: skip
    caption = (
        "Turns a refusal cut short are not sent (session_cut) and not counted here. Trimmed = the"
        " history left turns out, counted with the server's tokenizer; shifted = prompt + reply went"
        " past the slot and the reply still came whole; truncated = the reply stopped before its"
        " max_tokens because the slot was full."
    )
    blocks.append(Table(columns, rows, (False, False, *([True] * 10)), caption, "context-turns"))
    blocks += gap_blocks(analysis, "contexts")
    return Section("contexts", "Conversations beyond the slot context", tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return (context_section(analysis, plots),)


CHAPTER = Chapter(_sections, FIGURES)
