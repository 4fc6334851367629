"""The speed step's numbers: llama-bench tokens/s beside this machine's roofline ceilings."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from quantload.roofline.speed_file import SpeedFile


def roofline_frame(speed: SpeedFile | None, quants: Sequence[str]) -> pd.DataFrame:
    """One row per (quant, test): measured, memory and compute ceilings, bound, fraction."""
    if speed is None:
        return pd.DataFrame()
    rows: list[dict[str, Any]] = []
    for quant in [q for q in quants if q in speed.results] + [q for q in speed.results if q not in quants]:
        entry = speed.results[quant]
        for phase, ceiling in (("prefill", entry.roofline.prefill), ("decode", entry.roofline.decode)):
            bench = entry.bench.prefill if phase == "prefill" else entry.bench.decode
            rows.append(
                {
                    "quant": quant,
                    "phase": phase,
                    "test": ceiling.test,
                    "measured_tok_s": bench.tokens_per_s,
                    "stddev_tok_s": bench.stddev_tokens_per_s,
                    "memory_ceiling_tok_s": ceiling.memory_ceiling_tokens_per_s,
                    "compute_ceiling_tok_s": ceiling.compute_ceiling_tokens_per_s,
                    "ceiling_tok_s": ceiling.ceiling_tokens_per_s,
                    "bound": ceiling.bound,
                    "fraction_of_ceiling": ceiling.fraction_of_ceiling,
                    "bytes_per_token": ceiling.bytes_per_token,
                    "bits_per_weight": entry.roofline.bits_per_weight,
                    "explanation": entry.roofline.explanation,
                }
            )
    return pd.DataFrame(rows)
