"""The mixed experiment's tables from the records, the mixed-traffic diagnosis: what long prompts
do to everyone else's decode.

Per quantization and server batch size (`server_args`, e.g. "-b 256 -ub 256"), the decode-heavy
requests of the "alone" stage against the same requests in the "mixed" stage, where long prompts
were mixed in: their inter-token gaps (p50, p95, p99, pooled over every gap of every request),
TPOT and TTFT, and the long prompts' own TTFT (what a smaller batch costs them). The verdict says
in one sentence whether a smaller batch protected decode, and at what price.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.run_data import request_key
from quantload.analysis.stage_tables import USABLE
from quantload.experiments.mixed.stages import NAME
from quantload.stats import percentile

PHASES = ("alone", "mixed")


def _gaps(frame: pd.DataFrame, records_itl: dict[str, list[float]]) -> list[float]:
    return [gap for key in frame["_key"] for gap in records_itl.get(key, ())]


def mixed_table(
    records: pd.DataFrame,
    stages: pd.DataFrame,
    itl_by_request: dict[str, list[float]],
    quant_order: Sequence[str],
) -> pd.DataFrame:
    """One row per (quant, server_args, phase) of the complete mixed stages (see the docstring).

    `itl_by_request` maps each record's `request_key` to its gaps (records.jsonl keeps them per
    request; the records frame only holds their summary).
    """
    if records.empty or stages.empty or "phase" not in stages:
        return pd.DataFrame()
    usable = stages[(stages["experiment"] == NAME) & stages["status"].isin(USABLE)]
    if usable.empty:
        return pd.DataFrame()
    chosen = records[records["stage_id"].isin(usable["stage_id"]) & ~records["warmup"]].copy()
    chosen["_key"] = [
        request_key(s, t) for s, t in zip(chosen["stage_id"], chosen["sent_unix_s"], strict=True)
    ]
    meta = usable.set_index("stage_id")[["phase", "server_args", "users"]]
    chosen = chosen.drop(columns=[c for c in meta.columns if c in chosen]).join(meta, on="stage_id")
    rank = {quant: index for index, quant in enumerate(quant_order)}
    rows: list[dict[str, Any]] = []
    for (quant, args, phase), group in chosen.groupby(["quant", "server_args", "phase"], sort=False):
        ok = group[group["ok"]]
        decode = ok[ok["request_class"] == "decode"]
        long = ok[ok["request_class"] == "long_prompt"]
        gaps = _gaps(decode, itl_by_request)
        rows.append(
            {
                "quant": quant,
                "server_args": args,
                "phase": phase,
                "users": int(group["users"].iloc[0]) if group["users"].notna().any() else None,
                "decode_requests": int((group["request_class"] == "decode").sum()),
                "long_requests": int((group["request_class"] == "long_prompt").sum()),
                "failed": int((~group["ok"]).sum()),
                "itl_p50_s": percentile(gaps, 50),
                "itl_p95_s": percentile(gaps, 95),
                "itl_p99_s": percentile(gaps, 99),
                "itl_max_s": max(gaps) if gaps else None,
                "tpot_p50_s": percentile(decode["tpot_s"], 50),
                "tpot_p99_s": percentile(decode["tpot_s"], 99),
                "decode_ttft_p50_s": percentile(decode["ttft_s"], 50),
                "decode_ttft_p99_s": percentile(decode["ttft_s"], 99),
                "long_ttft_p50_s": percentile(long["ttft_s"], 50),
                "long_ttft_max_s": float(long["ttft_s"].max()) if len(long) else None,
                "long_prompt_tokens_p50": percentile(long["prompt_tokens"], 50),
                "_rank": rank.get(str(quant), len(rank)),
                "_phase": PHASES.index(str(phase)) if phase in PHASES else len(PHASES),
            }
        )
    if not rows:
        return pd.DataFrame()
    table = pd.DataFrame(rows).sort_values(["_rank", "server_args", "_phase"], kind="stable")
    return table.drop(columns=["_rank", "_phase"]).reset_index(drop=True)


@dataclass(frozen=True)
class BatchEffect:
    """One batch size of one quantization: decode ITL p99 alone and with long prompts mixed in."""

    quant: str
    server_args: str
    itl_p99_alone_s: float | None
    itl_p99_mixed_s: float | None
    long_ttft_p50_s: float | None

    @property
    def ratio(self) -> float | None:
        alone, mixed = self.itl_p99_alone_s, self.itl_p99_mixed_s
        return mixed / alone if alone and mixed is not None and alone > 0 else None


def batch_effects(table: pd.DataFrame) -> list[BatchEffect]:
    """The alone/mixed pairs of the table, one per (quant, batch size)."""
    effects: list[BatchEffect] = []
    if table.empty:
        return effects
    for (quant, args), group in table.groupby(["quant", "server_args"], sort=False):
        by_phase = {row["phase"]: row for row in group.to_dict("records")}
        alone, mixed = by_phase.get("alone", {}), by_phase.get("mixed", {})
        effects.append(
            BatchEffect(
                str(quant),
                str(args),
                alone.get("itl_p99_s"),
                mixed.get("itl_p99_s"),
                mixed.get("long_ttft_p50_s"),
            )
        )
    return effects


def _logical_batch(args: str) -> int | None:
    parts = args.split()
    if "-b" in parts and parts.index("-b") + 1 < len(parts) and parts[parts.index("-b") + 1].isdigit():
        return int(parts[parts.index("-b") + 1])
    return None


HURT_RATIO = 1.2  # long prompts "hurt" decode when they raise its ITL p99 by more than this factor
PROTECT_SHARE = 0.8  # a smaller batch "protects" when its rise and its mixed ITL p99 are this much lower


def _said(effect: BatchEffect) -> str:
    return (
        f"{fmt.duration(effect.itl_p99_alone_s)} to {fmt.duration(effect.itl_p99_mixed_s)}"
        f" (x{effect.ratio:.1f}) at {effect.server_args}"
    )


def _judge(effects: Sequence[BatchEffect]) -> tuple[str, str]:
    """(outcome, clause) for one quantization's batch sizes, largest batch first: the outcome is
    'protects', 'does not protect', 'no harm' or 'one batch size'."""
    large, small = effects[0], effects[-1]
    assert large.ratio is not None and small.ratio is not None
    if len(effects) == 1:
        only = f"long prompts raised decode ITL p99 from {_said(large)}; one batch size only"
        return "one batch size", only
    cost = ""
    if small.long_ttft_p50_s is not None and large.long_ttft_p50_s is not None:
        cost = (
            f", at the cost of long-prompt TTFT p50 {fmt.duration(large.long_ttft_p50_s)} →"
            f" {fmt.duration(small.long_ttft_p50_s)}"
        )
    if large.ratio < HURT_RATIO:
        return "no harm", (
            f"long prompts barely changed decode ITL p99 ({_said(large)}; {_said(small)}): there was"
            " little for a smaller batch to protect"
        )
    lower_rise = small.ratio < PROTECT_SHARE * large.ratio
    lower_p99 = (small.itl_p99_mixed_s or 0.0) < PROTECT_SHARE * (large.itl_p99_mixed_s or 0.0)
    if lower_rise and lower_p99:
        return "protects", (
            f"long prompts raised decode ITL p99 from {_said(large)} but only from {_said(small)}:"
            f" the smaller batch protects decode{cost}"
        )
    return "does not protect", (
        f"long prompts raised decode ITL p99 from {_said(large)} and from {_said(small)}:"
        f" the smaller batch did not protect decode here{cost}"
    )


def mixed_verdict(table: pd.DataFrame) -> str:
    """One sentence: did long prompts hurt decode, and did a smaller batch protect it (said for the
    first quantization; the others are named as agreeing or not)."""
    effects = [e for e in batch_effects(table) if e.ratio is not None]
    if not effects:
        return "not measured: no complete pair of alone and mixed stages"
    outcomes: dict[str, tuple[str, str]] = {}
    for quant in dict.fromkeys(e.quant for e in effects):
        mine = sorted(
            (e for e in effects if e.quant == quant),
            key=lambda e: _logical_batch(e.server_args) or 0,
            reverse=True,
        )
        outcomes[quant] = _judge(mine)
    first, (outcome, clause) = next(iter(outcomes.items()))
    others = [(quant, found[0]) for quant, found in list(outcomes.items())[1:]]
    agree = [quant for quant, other in others if other == outcome]
    differ = [f"{quant} ({other})" for quant, other in others if other != outcome]
    tail = f"; the same for {', '.join(agree)}" if agree else ""
    tail += f"; unlike {', '.join(differ)}" if differ else ""
    return f"{first}: {clause}{tail}."
