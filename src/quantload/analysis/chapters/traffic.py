"""Traffic like production: multi-turn sessions (one figure), the mixed-traffic diagnosis (two
figures and a one-sentence verdict), trace replay, the asked and delivered lengths of every
workload, and what TTFT means for a reasoning model."""

from __future__ import annotations

from pathlib import Path

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.chapters.parts import Chapter, Plots, not_run_section, shown, value
from quantload.analysis.document import Block, Paragraph, Section, Table
from quantload.analysis.plotting import Figure, colors, new_figure, save_figure

# ----------------------------------------------------------------------------- sessions


def _cache_label(cache_on: object) -> str:
    return "cache on" if bool(cache_on) else "cache off"


def _ttft_by_turn(analysis: Analysis, path: Path) -> Path | None:
    """TTFT p50 and prompt tokens by turn, one line per quantization and cache mode."""
    table = analysis.session_turns
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


SESSION_FIGURES = (Figure("ttft_by_turn", "TTFT and prompt tokens by turn", _ttft_by_turn),)


def sessions_section(analysis: Analysis, plots: Plots) -> Section:
    """TTFT and prompt tokens by turn, and each conversation's prefix-cache hit rate."""
    turns, summary = analysis.session_turns, analysis.session_hit_summary
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
        *shown(plots, SESSION_FIGURES[0]),
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


# ----------------------------------------------------------------------------- mixed traffic


def _mixed_itl(analysis: Analysis, path: Path) -> Path | None:
    """Decode ITL p95 and p99, alone and with long prompts, per batch size and quantization."""
    table = analysis.mixed
    if table.empty or table["itl_p99_s"].dropna().empty:
        return None
    groups = list(dict.fromkeys(zip(table["quant"], table["server_args"], strict=True)))
    figure, axes = new_figure(max(6.0, 2.2 * len(groups)), 4.2)
    axis = axes[0][0]
    width = 0.2
    for index, (quant, args) in enumerate(groups):
        rows = table[(table["quant"] == quant) & (table["server_args"] == args)]
        for offset, (phase, metric, color) in enumerate(
            (
                ("alone", "itl_p95_s", "#9ecae1"),
                ("alone", "itl_p99_s", "#3182bd"),
                ("mixed", "itl_p95_s", "#fdae6b"),
                ("mixed", "itl_p99_s", "#e6550d"),
            )
        ):
            found = rows[rows["phase"] == phase][metric].dropna()
            if found.empty:
                continue
            label = f"{phase} {metric[4:7]}" if index == 0 else None
            axis.bar(
                index + (offset - 1.5) * width, float(found.iloc[0]) * 1000, width, color=color, label=label
            )
    axis.set_xticks(range(len(groups)), [f"{quant}\n{args}" for quant, args in groups], fontsize=8)
    axis.set_ylabel("decode inter-token gap (ms)")
    axis.set_yscale("log")
    axis.grid(True, axis="y", alpha=0.3)
    axis.legend(fontsize=8)
    axis.set_title("Decode-heavy requests: ITL alone and with long prompts mixed in")
    return save_figure(figure, path)


def _short_batch(args: object) -> str:
    parts = str(args).split()
    return f"b{parts[1]}" if len(parts) > 1 and parts[0] == "-b" else str(args)


def _mixed_timeline(analysis: Analysis, path: Path) -> Path | None:
    """Busy slots, KV cells used and requests deferred over each quantization's mixed stages."""
    series, stages = analysis.server_series, analysis.stages
    if series.empty or stages.empty:
        return None
    mixed = stages[(stages["experiment"] == "mixed")].dropna(subset=["started_unix_s", "ended_unix_s"])
    quants = [q for q in analysis.quants if (mixed["quant"] == q).any()]
    if not quants:
        return None
    panels = [("slots_busy", "busy slots"), ("kv_used_ratio", "KV cells used\n(fraction)"),
              ("requests_deferred", "requests\ndeferred")]  # fmt: skip
    figure, axes = new_figure(4.2 * len(quants), 6.4, len(panels), len(quants), sharey="row")
    palette = colors(analysis.quants)
    drawn = False
    for column, quant in enumerate(quants):
        mine = mixed[mixed["quant"] == quant]
        start, end = float(mine["started_unix_s"].min()), float(mine["ended_unix_s"].max())
        inside = (series["unix_s"] >= start - 2) & (series["unix_s"] <= end + 2)
        window = series[(series["quant"] == quant) & inside]
        for row, (metric, label) in enumerate(panels):
            axis = axes[row][column]
            for stage in mine.itertuples():
                shade = "#fde0c5" if stage.phase == "mixed" else "#deebf7"
                left, right = stage.started_unix_s - start, stage.ended_unix_s - start
                axis.axvspan(left, right, color=shade, zorder=0, linewidth=0)
                if row == 0 and (right - left) > 0.06 * max(end - start, 1.0):
                    axis.text(
                        (left + right) / 2, 1.01, f"{stage.phase}\n{_short_batch(stage.server_args)}",
                        transform=axis.get_xaxis_transform(), ha="center", va="bottom", fontsize=6,
                    )  # fmt: skip
            frame = window[window["metric"] == metric]
            if not frame.empty:
                drawn = True
                axis.plot(frame["unix_s"] - start, frame["value"], color=palette.get(quant))
            axis.grid(True, alpha=0.3)
            if column == 0:
                axis.set_ylabel(label, fontsize=8)
        axes[0][column].set_title(quant, fontsize=9, pad=18)
        axes[-1][column].set_xlabel("s from its first mixed stage")
    if not drawn:
        return None
    figure.suptitle("During the mixed stages (blue: decode alone, orange: long prompts mixed in)")
    return save_figure(figure, path)


MIXED_FIGURES = (
    Figure("mixed_itl", "Decode ITL alone and with long prompts", _mixed_itl),
    Figure(
        "mixed_timeline", "Busy slots, KV use and deferred requests during the mixed stages", _mixed_timeline
    ),
)


def mixed_section(analysis: Analysis, plots: Plots) -> Section:
    """The mixed-traffic diagnosis: decode ITL with and without long prompts, per batch size."""
    table = analysis.mixed
    title = "Mixed traffic: long prompts against everyone's decode"
    if table.empty:
        return not_run_section("mixed", title, "no complete mixed-traffic stage (the mixed experiment)")
    blocks: list[Block] = [
        Paragraph(
            "Decode-heavy requests (a short prompt, a long answer) first alone, then the same requests"
            " with long prompts mixed in. Every server step decodes one token for each running request"
            " and then takes up to -b prompt tokens of waiting prompts (llama.cpp's chunked prefill), so"
            " a long prompt stretches the steps of everyone decoding beside it; a smaller -b/-ub spreads"
            " it over more, shorter steps. ITL pools every gap of every decode-heavy request."
        ),
        Paragraph(analysis.mixed_verdict, "verdict"),
    ]
    rows = tuple(
        (
            str(r["quant"]),
            str(r["server_args"]),
            str(r["phase"]),
            f"{r['decode_requests']} + {r['long_requests']}",
            fmt.duration(value(r["itl_p50_s"])),
            fmt.duration(value(r["itl_p95_s"])),
            fmt.duration(value(r["itl_p99_s"])),
            fmt.duration(value(r["tpot_p50_s"])),
            fmt.duration(value(r["tpot_p99_s"])),
            fmt.duration(value(r["decode_ttft_p50_s"])),
            fmt.duration(value(r["long_ttft_p50_s"])),
        )
        for r in table.to_dict("records")
    )
    columns = (
        *("quant", "batch", "phase", "decode + long", "ITL p50", "ITL p95", "ITL p99"),
        *("TPOT p50", "TPOT p99", "decode TTFT p50", "long-prompt TTFT p50"),
    )
    blocks.append(
        Table(columns, rows, (False, False, False, *([True] * 8)), "Decode-heavy requests' figures")
    )
    blocks += [block for figure in MIXED_FIGURES for block in shown(plots, figure)]
    if plots.get("mixed_timeline") is None:
        blocks.append(
            Paragraph(
                "not measured: busy slots, KV use and deferred requests over time need Prometheus"
                f" ({analysis.prometheus_origin or 'none was available to the report'})",
                "warning",
            )
        )
    return Section("mixed", title, tuple(blocks))


# ----------------------------------------------------------------------------- trace replay


def trace_section(analysis: Analysis) -> Section:
    """A trace replayed open loop: the pace kept, latency from the intended send time, client lag."""
    stages = analysis.stages
    chosen = stages[stages["experiment"] == "trace"] if not stages.empty else stages
    if chosen.empty:
        return not_run_section("trace", "Trace replay", "no trace was given (trace.path)")
    rows = tuple(
        (
            str(r["quant"]),
            str(r.get("phase") or ""),
            str(r["status"]),
            f"{r['ok']} / {r['requests']}",
            fmt.number(value(r["rate_rps"]), 2),
            fmt.number(value(r["requests_per_s"]), 2),
            fmt.duration(value(r["ttft_from_intended_p50_s"])),
            fmt.duration(value(r["ttft_from_intended_p99_s"])),
            fmt.duration(value(r["lag_p50_s"])),
            fmt.duration(value(r["lag_p99_s"])),
            fmt.duration(value(r["lag_max_s"])),
        )
        for r in chosen.to_dict("records")
    )
    columns = ("quant", "speed", "status", "ok / sent", "trace req/s", "achieved req/s", "TTFT p50",
               "TTFT p99", "client lag p50", "lag p99", "lag max")  # fmt: skip
    return Section(
        "trace",
        "Trace replay",
        (
            Paragraph(
                "Requests were sent open loop at the trace's own arrival times (divided by the speed"
                " factor); TTFT runs from each request's intended send time, so queueing behind a slow"
                " server is counted. Client lag is how late the load generator sent a request after it"
                " was due: large lag means the figures also hold the client's delay."
            ),
            Table(columns, rows, (False, False, False, *([True] * 8))),
        ),
    )


# ----------------------------------------------------------------------------- lengths and reasoning


def lengths_section(analysis: Analysis) -> Section:
    """Asked against delivered lengths, per experiment and workload."""
    records = analysis.run.records
    rows = []
    if not records.empty and "workload" in records:
        measured = records[~records["warmup"] & records["ok"] & records["workload"].notna()]
        for (experiment, workload), group in measured.groupby(["experiment", "workload"], sort=False):
            asked_in = group.dropna(subset=["prompt_tokens_asked", "prompt_tokens"])
            asked_out = group.dropna(subset=["max_tokens", "completion_tokens"])
            exact_in = (
                (asked_in["prompt_tokens"] == asked_in["prompt_tokens_asked"]).mean()
                if len(asked_in)
                else None
            )
            near_in = (
                ((asked_in["prompt_tokens"] - asked_in["prompt_tokens_asked"]).abs() <= 2).mean()
                if len(asked_in)
                else None
            )
            exact_out = (
                (asked_out["completion_tokens"] == asked_out["max_tokens"]).mean() if len(asked_out) else None
            )
            rows.append(
                (
                    str(experiment),
                    str(workload),
                    str(len(group)),
                    fmt.number(value(asked_in["prompt_tokens_asked"].mean()) if len(asked_in) else None, 0),
                    fmt.number(value(group["prompt_tokens"].mean()), 0),
                    fmt.percent(value(exact_in), 0),
                    fmt.percent(value(near_in), 0),
                    fmt.number(value(group["max_tokens"].mean()), 0),
                    fmt.number(value(group["completion_tokens"].mean()), 0),
                    fmt.percent(value(exact_out), 0),
                )
            )
    if not rows:
        return Section(
            "lengths", "Asked and delivered lengths", (Paragraph("not measured: no records", "warning"),)
        )
    columns = ("experiment", "workload", "requests", "prompt asked", "prompt sent", "exact", "within 2",
               "output asked", "output got", "exact")  # fmt: skip
    return Section(
        "lengths",
        "Asked and delivered lengths",
        (
            Paragraph(
                "Output lengths are enforced with max_tokens and ignore_eos, so a request's answer is as"
                " long as its workload asked whatever the model does (the prompt set leaves ignore_eos as"
                " configured). Synthetic prompts are cut to a whole-prompt length with the server's own"
                " /tokenize and /detokenize, the chat template's tokens (/apply-template) counted in;"
                " 'prompt sent' is the server's usage.prompt_tokens. Means over successful requests."
            ),
            Table(columns, tuple(rows), (False, False, *([True] * 8))),
        ),
    )


def reasoning_section(analysis: Analysis) -> Section:
    """What TTFT means here, and the time to the first answer for a reasoning model."""
    title = "Reasoning models: which TTFT"
    table = analysis.reasoning
    if table.empty:
        return not_run_section(
            "reasoning", title,
            "no request of this run carried reasoning content (TTFT here is the first generated token of"
            " any kind)",
        )  # fmt: skip
    blocks: list[Block] = [
        Paragraph(
            "TTFT in this report is the time to the first generated token of any kind: a reasoning"
            " model's delta.reasoning_content counts, as it is generated (and paid for) like any other"
            " token, and its chunks count for ITL and TPOT. The time to the first answer content"
            " (delta.content) is recorded beside it (ttft_content_s)."
        )
    ]
    if not table.empty:
        rows = tuple(
            (
                str(r["quant"]),
                str(r["experiment"]),
                str(r["requests"]),
                fmt.number(value(r["reasoning_chunks_mean"]), 0),
                fmt.duration(value(r["ttft_p50_s"])),
                fmt.duration(value(r["ttft_content_p50_s"])),
                fmt.duration(value(r["ttft_content_p99_s"])),
                str(r["no_content"]),
            )
            for r in table.to_dict("records")
        )
        blocks.append(
            Table(
                (
                    "quant",
                    "experiment",
                    "requests",
                    "reasoning chunks",
                    "TTFT p50 (any token)",
                    "first answer p50",
                    "first answer p99",
                    "no answer content",
                ),
                rows,
                (False, False, True, True, True, True, True, True),
            )
        )
    return Section("reasoning", title, tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return (
        sessions_section(analysis, plots),
        mixed_section(analysis, plots),
        trace_section(analysis),
        lengths_section(analysis),
        reasoning_section(analysis),
    )


CHAPTER = Chapter(_sections, SESSION_FIGURES + MIXED_FIGURES)
