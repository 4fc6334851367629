"""Traffic like production: trace replay, the asked and delivered lengths of every workload, and
what TTFT means for a reasoning model. The sessions and mixed experiments' own chapters (in their
folders under quantload.experiments) come right before it; the trace replay's section is the trace
experiment's (its folder, declaring `within="traffic"` on its ExperimentReport), shown first here."""

from __future__ import annotations

from collections.abc import Sequence

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.chapters.parts import Chapter, Plots, not_run_section, value
from quantload.analysis.document import Block, Paragraph, Section, Table

KEY = "traffic"  # what an experiment's report part names in `within` to be shown here

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


def chapter(experiments: Sequence[Chapter]) -> Chapter:
    """The chapter: the sections and figures of `experiments` (the report parts placed within it,
    in the registry's order: the trace replay), then the lengths and reasoning sections."""

    def sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
        own = (section for part in experiments for section in part.sections(analysis, plots))
        return (*own, lengths_section(analysis), reasoning_section(analysis))

    return Chapter(sections, tuple(figure for part in experiments for figure in part.figures))
