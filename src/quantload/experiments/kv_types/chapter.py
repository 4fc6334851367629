"""The kv_types experiment's chapter: the KV-cache type trade-off (memory, decode speed, quality
cost; one figure), per quantization and KV-cache type. It closes the model files chapter."""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.chapters.model_files import kld_with_error, pct_with_error
from quantload.analysis.chapters.parts import Chapter, Plots, gap_blocks, shown, value
from quantload.analysis.document import Block, Section, Table
from quantload.analysis.plotting import Figure, colors, new_figure, save_figure
from quantload.analysis.quality_loss import KLD_DIGITS
from quantload.experiments.kv_types.findings import GAP_SECTION, findings_of

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


def _kv_types_figure(analysis: Analysis, path: Path) -> Path | None:
    """KV memory, decode throughput and quality loss per quantization, one bar per cache type."""
    table = findings_of(analysis).table
    if table.empty:
        return None
    quants = [q for q in analysis.quants if q in set(table["quant"])]
    types = list(dict.fromkeys(str(t) for t in table["cache_type"]))
    figure, axes = new_figure(12.0, 4.2, 1, 3)
    palette = colors(types)
    width = 0.8 / max(len(types), 1)
    users = sorted({int(u) for u in table["users"].dropna()})
    at = f" at {users[0]} users" if len(users) == 1 else ""
    panels = (
        ("kv_predicted_mib", "KV cache, MiB (exact)", None),
        ("output_tok_s", f"output tok/s{at} (decode-heavy)", None),
        ("kld_mean_nats", "mean KLD from F16, nats", "kld_mean_error_nats"),
    )
    for axis, (column, title, error) in zip(axes[0], panels, strict=True):
        for index, kind in enumerate(types):
            mine = table[table["cache_type"] == kind].set_index("quant")
            xs = [position + (index - (len(types) - 1) / 2) * width for position in range(len(quants))]
            heights = [_cell(mine, q, column) for q in quants]
            spreads = [_cell(mine, q, error) if error else 0.0 for q in quants]
            axis.bar(xs, [h if math.isfinite(h) else 0.0 for h in heights], width,
                     yerr=[e if math.isfinite(e) else 0.0 for e in spreads] if error else None,
                     color=palette[kind], label=f"K/V {kind}", capsize=2)  # fmt: skip
        axis.set_xticks(list(range(len(quants))), quants)
        axis.set_title(title, fontsize=10)
        axis.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    figure.suptitle("KV-cache type trade-off: memory, decode speed and quality cost")
    return save_figure(figure, path)


def _cell(frame: pd.DataFrame, quant: str, column: str | None) -> float:
    if column is None or quant not in frame.index:
        return float("nan")
    number = value(frame.loc[quant, column])
    return number if number is not None else float("nan")


def _decided(row: dict[str, object]) -> str:
    ratio = value(row.get("decode_vs_f16"))
    if ratio is None:
        return fmt.DASH
    bounds = (value(row.get("decode_vs_f16_low")), value(row.get("decode_vs_f16_high")))
    interval = fmt.with_interval(ratio, bounds, "number")
    said = {"a": "faster", "b": "slower"}.get(str(row.get("decode_faster")), "no difference shown")
    return f"x{interval}: {said}"


FIGURES = (Figure("kv_cache_types", "KV-cache type trade-off per quantization", _kv_types_figure),)


def kv_types_section(analysis: Analysis, plots: Plots) -> Section:
    """Per quantization and KV-cache type: memory, decode speed at the experiment's users, KLD."""
    table = findings_of(analysis).table
    blocks: list[Block] = [*shown(plots, FIGURES[0])]
    rows = tuple(
        (
            str(r["quant"]),
            str(r["cache_type"]) + (" (served)" if r["own_server"] else ""),
            fmt.number(value(r["kv_predicted_mib"]), 2),
            fmt.number(value(r["kv_reported_mib"]), 2),
            fmt.percent(value(r["kv_vs_f16_frac"]), 0, signed=True),
            fmt.number(value(r["output_tok_s"])),
            fmt.percent(value(r["output_vs_f16_frac"]), 1, signed=True),
            fmt.duration(value(r["tpot_p50_s"])),
            _decided(r),
            kld_with_error(value(r["kld_mean_nats"]), value(r["kld_mean_error_nats"])),
            fmt.number(value(r["kld_added_nats"]), KLD_DIGITS),
            pct_with_error(value(r["same_top_p_pct"])),
            str(r["flash_attn"] or fmt.DASH),
        )
        for r in table.to_dict("records")
    )
    if rows:
        users = sorted({int(u) for u in table["users"].dropna()})
        at = f"{users[0]} users" if len(users) == 1 else "the experiment's users"
        blocks.append(
            Table(
                ("quant", "K/V cache", "KV MiB", "reported MiB", "KV vs f16", f"output tok/s @{at}",
                 "vs f16", "TPOT p50", "decode vs f16 (decided)", "mean KLD ± s.e.", "KLD added",
                 "same top token", "flash attn"),
                rows,
                (False, False, True, True, True, True, True, True, False, True, True, True, False),
                "KV MiB: the exact allocation (the KV check's arithmetic) for the run's slots and context;"
                " reported: what that cache type's llama-server logged. Speed: one closed-loop stage of"
                f" decode-heavy requests (short prompts, max_tokens with ignore_eos, cache_prompt off) at"
                f" {at} on each server, the quantization's own server for the type it serves (served) and"
                " one started for each other type. KLD: llama-perplexity with the same -ctk/-ctv (and"
                " flash attention on for a quantized V cache); KLD added is the cost of the cache type"
                " beyond the weights' own loss (f16 cache). Decode vs f16: the f16 cache's median TPOT over"
                " this type's with its bootstrap 95 % interval; faster or slower only where the interval"
                " shows it.",
            )
        )
    blocks += gap_blocks(analysis, GAP_SECTION)
    return Section("kv_types", "KV-cache type trade-off", tuple(blocks))


def _sections(analysis: Analysis, plots: Plots) -> tuple[Section, ...]:
    return (kv_types_section(analysis, plots),)


CHAPTER = Chapter(_sections, FIGURES)
