"""Traffic like production: trace replay, the asked and delivered lengths of every workload, and
what TTFT means for a reasoning model. The sessions and mixed experiments' own chapters (in their
folders under quantload.experiments) come right before it."""

from __future__ import annotations

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.chapters.parts import Chapter, Plots, not_run_section, value
from quantload.analysis.document import Block, Paragraph, Section, Table

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
        trace_section(analysis),
        lengths_section(analysis),
        reasoning_section(analysis),
    )


CHAPTER = Chapter(_sections)
