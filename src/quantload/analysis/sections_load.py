"""Report sections about the load test: the seed's table, plots, capacity, TTFT split, prompt cache,
every stage."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.capacity import slo_text
from quantload.analysis.document import (
    Block,
    Bullets,
    Details,
    Paragraph,
    Section,
    Table,
)
from quantload.analysis.section_parts import (
    cache_state_block,
    gap_blocks,
    image_block,
    range_text,
    value,
)
from quantload.analysis.seed_table import level_column, users_levels


def _plus_minus(number: float | None, spread: float | None, digits: int = 1) -> str:
    """'12.3 ± 0.4', just the number when there is no spread, a dash when there is no number."""
    if number is None:
        return fmt.DASH
    text = fmt.number(number, digits)
    return f"{text} ± {fmt.number(spread, digits)}" if spread is not None else text


def seed_section(analysis: Analysis) -> Section:
    """The seed's table, one row per quantization."""
    levels = users_levels(analysis.run, analysis.levels)
    columns = ["quant", "file size", "perplexity ± s.e.", "prefill tok/s ± sd", "decode tok/s ± sd"]
    for users in levels:
        columns += [f"TTFT p50 @{users}u", f"TTFT p99 @{users}u", f"output tok/s @{users}u"]
    rows = []
    for row in analysis.seed.to_dict("records"):
        ppl, err = value(row["perplexity"]), value(row["perplexity_error"])
        cells = [
            str(row["quant"]),
            fmt.mib(value(row["file_size_bytes"])),
            _plus_minus(ppl, err, 3),
            _plus_minus(value(row["prefill_tok_s"]), value(row["prefill_stddev_tok_s"])),
            _plus_minus(value(row["decode_tok_s"]), value(row["decode_stddev_tok_s"])),
        ]
        for users in levels:
            cells += [
                range_text(row, level_column("ttft_p50_s", users)),
                range_text(row, level_column("ttft_p99_s", users)),
                range_text(row, level_column("output_tok_s", users), "number"),
            ]
        rows.append(tuple(cells))
    caption = (
        "Load figures: concurrency sweep, median of the complete repeats with the min–max range in"
        " brackets; percentiles exact from the records. Perplexity ± one standard error"
        " (llama-perplexity); tok/s ± standard deviation over llama-bench repetitions. – = not measured."
    )
    blocks: list[Block] = [*cache_state_block(analysis, "concurrency sweep")]
    blocks.append(
        Table(tuple(columns), tuple(rows), (False, *([True] * (len(columns) - 1))), caption, "seed-table")
    )
    blocks += gap_blocks(analysis, "model files", "quality", "speed", "load")
    return Section("table", "The table: one row per quantization", tuple(blocks))


def load_plots(analysis: Analysis, plots: Mapping[str, Path | None], out_dir: Path) -> Section:
    """TTFT, throughput and latency-throughput plots."""
    blocks: list[Block] = []
    for key in ("ttft_vs_concurrency", "throughput_vs_concurrency", "latency_vs_throughput"):
        blocks += image_block(plots, key, out_dir)
    if not blocks:
        blocks.append(Paragraph("not measured: no complete concurrency-sweep stage to plot", "warning"))
    return Section("plots", "Latency and throughput under load", tuple(blocks))


def capacity_section(analysis: Analysis) -> Section:
    """Per level against the SLO, and goodput."""
    rows = []
    for verdict in analysis.capacity:
        by_users = {
            int(r["users"]): r for r in analysis.levels.to_dict("records") if r["quant"] == verdict.quant
        }
        for check in verdict.checks:
            row = by_users.get(check.users, {})
            judged = fmt.DASH if check.meets is None else ("meets" if check.meets else f"misses: {check.why}")
            if check.meets and check.every_repeat_meets is False:
                judged += " (not every repeat)"
            rows.append(
                (
                    verdict.quant,
                    str(check.users),
                    range_text(row, "ttft_p99_s"),
                    range_text(row, "tpot_p99_s"),
                    fmt.percent(check.failed_frac),
                    fmt.percent(value(row.get("good_frac"))),
                    range_text(row, "goodput_rps", "number"),
                    range_text(row, "output_tok_s", "number"),
                    judged,
                )
            )
    blocks: list[Block] = [
        Paragraph(
            f"SLO: {slo_text(analysis.slo)}. A level meets it when the median of its repeats does;"
            " the capacity is the highest level met with every lower level met too. Goodput counts the"
            " requests that succeeded within their deadline and met both limits on their own, per"
            " second of the stage (open loop: TTFT from the intended send time)."
        ),
        Bullets(tuple(v.sentence for v in analysis.capacity), "verdict"),
    ]
    if rows:
        columns = (
            "quant",
            "users",
            "TTFT p99",
            "TPOT p99",
            "failed",
            "good requests",
            "goodput req/s",
            "output tok/s",
            "SLO",
        )
        blocks.append(Table(columns, tuple(rows), (False, True, True, True, True, True, True, True, False)))
    return Section("capacity", "Capacity under the SLO (goodput)", tuple(blocks))


def ttft_split_section(analysis: Analysis) -> Section:
    """Queueing+network against prefill."""
    table = analysis.ttft_split
    blocks: list[Block] = [
        Paragraph(
            "llama-server's timings.prompt_ms runs from the moment a slot takes the request to the end of"
            " its prompt (prefill); the rest of the client's TTFT is queueing for a slot, the network and"
            " HTTP handling. Pooled over the complete repeats of each level; p50 and p99 of each part are"
            " taken separately, so they need not add up."
        )
    ]
    if table.empty:
        blocks.append(Paragraph("not measured: no complete sweep stage with server timings", "warning"))
    else:
        rows = tuple(
            (
                str(r["quant"]),
                str(r["users"]),
                str(r["requests"]),
                fmt.duration(value(r["ttft_p50_s"])),
                fmt.duration(value(r["prefill_p50_s"])),
                fmt.duration(value(r["queue_network_p50_s"])),
                fmt.percent(value(r["queue_share_p50"]), 0),
                fmt.duration(value(r["ttft_p99_s"])),
                fmt.duration(value(r["prefill_p99_s"])),
                fmt.duration(value(r["queue_network_p99_s"])),
            )
            for r in table.to_dict("records")
        )
        columns = (
            "quant",
            "users",
            "requests",
            "TTFT p50",
            "prefill p50",
            "queue+network p50",
            "queue share",
            "TTFT p99",
            "prefill p99",
            "queue+network p99",
        )
        blocks.append(Table(columns, rows, (False, *([True] * 9))))
        negative = int(table["negative_queue"].sum())
        if negative:
            blocks.append(
                Paragraph(
                    f"{negative} request(s) had a server prompt time longer than the client's TTFT; the split"
                    " is approximate for them.",
                    "muted",
                )
            )
    return Section("ttft_split", "Where TTFT goes: queueing+network and prefill", tuple(blocks))


def prompt_cache_section(analysis: Analysis) -> Section:
    """Cache off against on."""
    blocks: list[Block] = [*cache_state_block(analysis, "prompt-cache experiment")]
    rows = []
    for item in analysis.prompt_cache:
        off, on = item.off, item.on
        rows.append(
            (
                item.quant,
                str(item.prefix_tokens or fmt.DASH),
                fmt.with_range(off.ttft_p50_s, *off.ttft_p50_range_s) if off else fmt.DASH,
                fmt.with_range(on.ttft_p50_s, *on.ttft_p50_range_s) if on else fmt.DASH,
                f"{item.speedup_p50:.2f}×" if item.speedup_p50 else fmt.DASH,
                fmt.with_range(off.ttft_p99_s, *off.ttft_p99_range_s) if off else fmt.DASH,
                fmt.with_range(on.ttft_p99_s, *on.ttft_p99_range_s) if on else fmt.DASH,
                f"{item.speedup_p99:.2f}×" if item.speedup_p99 else fmt.DASH,
                fmt.number(off.cache_n_mean, 0) if off else fmt.DASH,
                fmt.number(on.cache_n_mean, 0) if on else fmt.DASH,
            )
        )
    if rows:
        columns = (
            "quant",
            "shared prefix tokens",
            "TTFT p50 off",
            "TTFT p50 on",
            "speed-up p50",
            "TTFT p99 off",
            "TTFT p99 on",
            "speed-up p99",
            "reused tokens off",
            "reused tokens on",
        )
        caption = (
            "Median of repeats (min–max). Speed-up = TTFT off / TTFT on. Reused tokens: mean of the"
            " server's timings.cache_n, the prompt tokens it took from the cache."
        )
        blocks.append(Table(columns, tuple(rows), (False, *([True] * 9)), caption))
    blocks += gap_blocks(analysis, "prompt_cache")
    if not rows and not blocks:
        blocks.append(Paragraph("not measured: the run has no prompt-cache stages", "warning"))
    return Section("prompt_cache", "Prompt cache: TTFT with caching off and on", tuple(blocks))


def open_loop_section(analysis: Analysis) -> Section:
    """Poisson arrivals at set rates; latency from the intended send time."""
    table = analysis.open_loop
    if table.empty:
        return Section(
            "open_loop",
            "Open loop (Poisson arrivals)",
            (Paragraph("Not run: no open-loop rates were configured (load.rates_rps).", "muted"),),
        )
    rows = tuple(
        (
            str(r["quant"]),
            f"{fmt.number(value(r['rate_rps']), 2)} req/s",
            range_text(r, "requests_per_s", "number"),
            range_text(r, "ttft_from_intended_p50_s"),
            range_text(r, "ttft_from_intended_p99_s"),
            range_text(r, "tpot_p99_s"),
            range_text(r, "output_tok_s", "number"),
            fmt.percent(value(r["failed_frac"])),
            fmt.percent(value(r["good_frac"])),
        )
        for r in table.to_dict("records")
    )
    columns = ("quant", "target rate", "achieved req/s", "TTFT p50", "TTFT p99", "TPOT p99", "output tok/s",
               "failed", "good requests")  # fmt: skip
    caption = (
        "TTFT here runs from each request's intended send time (its Poisson arrival), so a client that"
        " fell behind cannot hide queueing; median of repeats (min–max)."
    )
    blocks: list[Block] = [*cache_state_block(analysis, "open loop")]
    blocks.append(Table(columns, rows, (False, *([True] * 8)), caption))
    return Section("open_loop", "Open loop (Poisson arrivals)", tuple(blocks))


def stages_section(analysis: Analysis) -> Section:
    """Every stage, for the curious."""
    table = analysis.stages
    if table.empty:
        return Section("stages", "Every load stage", (Paragraph("not measured: no load stages", "warning"),))
    rows = tuple(
        (
            str(r["quant"]),
            str(r["experiment"]),
            f"{r['rate_rps']} req/s" if value(r["rate_rps"]) is not None else str(r["users"]),
            str(r["repeat"]),
            "on" if r["cache_prompt"] else "off",
            str(r["status"]),
            f"{r['ok']} / {r['requests']}",
            fmt.duration(value(r["ttft_p50_s"])),
            fmt.duration(value(r["ttft_p99_s"])),
            fmt.duration(value(r["tpot_p50_s"])),
            fmt.duration(value(r["e2e_p50_s"])),
            fmt.number(value(r["output_tok_s"])),
            fmt.duration(value(r["lag_p99_s"])),
        )
        for r in table.to_dict("records")
    )
    columns = (
        "quant",
        "experiment",
        "users",
        "repeat",
        "cache",
        "status",
        "ok / sent",
        "TTFT p50",
        "TTFT p99",
        "TPOT p50",
        "e2e p50",
        "output tok/s",
        "send lag p99",
    )
    return Section(
        "stages",
        "Every load stage",
        (
            Details(
                f"{len(rows)} stage(s)",
                (Table(columns, rows, (False, False, True, True, False, False, *([True] * 7))),),
            ),
        ),
    )
