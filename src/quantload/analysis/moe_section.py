"""The report's section on a mixture of experts: what a token reads, and what batching does to it.

For each MoE file of the run (the manifest's `moe` facts, quantload.models.moe) and the speed
step's roofline: parameters in all and active, the bytes a generated token reads (its experts'
share) against the bytes of every expert, and llama-bench's decode against two memory ceilings,
the one of the bytes it reads and the one it would have if it read every expert. A decode faster
than the second ceiling cannot have read every expert: it follows the active size.

Batching: a step of N sequences routes each token on its own and touches 1 - (1 - used/count)^N
of each layer's experts (uniform routing), so the bytes a step reads grow with the users of the
load sweep; the table sets the sweep's measured output tokens/s beside the memory ceiling of those
bytes at each level.
"""

from __future__ import annotations

from typing import Any

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis
from quantload.analysis.document import Block, Paragraph, Section, Table
from quantload.models.moe import touched_share

DECODE_COLUMNS = (
    "quant", "params", "active", "experts used", "MB read / token", "MB if every expert",
    "decode tok/s", "ceiling (active)", "ceiling (every expert)",
)  # fmt: skip
BATCHING_COLUMNS = (
    "quant", "users", "experts a step touches", "MB read / step", "memory ceiling tok/s",
    "measured output tok/s",
)  # fmt: skip


def _moe_files(analysis: Analysis) -> dict[str, dict[str, Any]]:
    manifest = analysis.run.manifest
    if manifest is None:
        return {}
    files = manifest.files.items()
    return {label: entry.moe for label, entry in files if entry.moe and label in analysis.quants}


def _decode_rows(
    analysis: Analysis, moes: dict[str, dict[str, Any]]
) -> tuple[list[tuple[str, ...]], list[str]]:
    speed = analysis.run.speed
    rows: list[tuple[str, ...]] = []
    said: list[str] = []
    for quant, moe in moes.items():
        entry = speed.results.get(quant) if speed is not None else None
        active_mb = all_mb = measured = ceiling = ceiling_all = None
        roof = entry.roofline if entry is not None else None
        if roof is not None:  # none where the test ran on a GPU of unknown limits
            bandwidth = roof.bandwidth_bytes_per_s
            read = roof.decode.bytes_per_token
            every = read + moe["expert_bytes"] * (1 - moe["expert_used_count"] / moe["expert_count"])
            active_mb, all_mb = read / 1e6, every / 1e6
            measured = roof.decode.measured_tokens_per_s
            ceiling, ceiling_all = bandwidth / read, bandwidth / every
            if measured > ceiling_all:
                said.append(
                    f"{quant}: decode ({measured:,.1f} tok/s) is faster than reading every expert would"
                    f" allow ({ceiling_all:,.1f} tok/s at {all_mb:,.1f} MB per token), so it follows the"
                    f" active size: each token reads {moe['expert_used_count']} of"
                    f" {moe['expert_count']} experts."
                )
            else:
                said.append(
                    f"{quant}: decode ({measured:,.1f} tok/s) stays below both memory ceilings"
                    f" ({ceiling:,.1f} tok/s reading the active experts, {ceiling_all:,.1f} reading all),"
                    " so the roofline alone cannot tell which size it follows; set it beside dense"
                    " models of its total and active size (benchmarks/moe_vs_dense.py)."
                )
        rows.append((
            quant,
            f"{moe['total_params'] / 1e6:,.1f} M",
            f"{moe['active_params'] / 1e6:,.1f} M",
            f"{moe['expert_used_count']} of {moe['expert_count']}",
            fmt.number(active_mb),
            fmt.number(all_mb),
            fmt.number(measured),
            fmt.number(ceiling),
            fmt.number(ceiling_all),
        ))  # fmt: skip
    return rows, said


def _batching_rows(analysis: Analysis, moes: dict[str, dict[str, Any]]) -> list[tuple[str, ...]]:
    levels, speed = analysis.levels, analysis.run.speed
    if levels.empty or speed is None or "users" not in levels:
        return []
    rows: list[tuple[str, ...]] = []  # the levels are the sweep's (stage_tables.level_table)
    for quant, moe in moes.items():
        entry = speed.results.get(quant)
        if entry is None or entry.roofline is None:
            continue
        bandwidth = entry.roofline.bandwidth_bytes_per_s
        read = entry.roofline.decode.bytes_per_token
        one = moe["expert_bytes"] * moe["expert_used_count"] / moe["expert_count"]
        for row in levels[levels["quant"] == quant].to_dict("records"):
            users = int(row["users"])
            share = touched_share(moe["expert_used_count"], moe["expert_count"], users)
            step = read - one + moe["expert_bytes"] * share
            rows.append((
                quant, str(users), fmt.percent(share, 0), fmt.number(step / 1e6),
                fmt.number(users * bandwidth / step), fmt.number(row.get("output_tok_s")),
            ))  # fmt: skip
    return rows


def moe_section(analysis: Analysis) -> Section | None:
    """The section, or None when no file of the run is a mixture of experts."""
    moes = _moe_files(analysis)
    if not moes:
        return None
    decode, said = _decode_rows(analysis, moes)
    blocks: list[Block] = [
        Table(
            DECODE_COLUMNS,
            tuple(decode),
            (False, True, True, False, True, True, True, True, True),
            "Every expert is in memory; a generated token reads only the ones it is routed to. Ceilings"
            " are the machine's bandwidth over the bytes per token (llama-bench decode, one sequence).",
        )
    ]
    blocks += [Paragraph(line) for line in said]
    batching = _batching_rows(analysis, moes)
    if batching:
        blocks.append(
            Table(
                BATCHING_COLUMNS,
                tuple(batching),
                (False, True, True, True, True, True),
                "More users route more tokens per step, touching more experts (uniform routing"
                " assumed): the bytes a step reads grow towards every expert's, and the MoE's lead"
                " over a dense model of its total size shrinks.",
            )
        )
    return Section("moe", "Mixture of experts: what a token reads", tuple(blocks))
