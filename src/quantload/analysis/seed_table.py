"""The seed's table: one row per quantization, every load figure the median of its repeats.

Columns: file size, perplexity and its +/- (one standard error), llama-bench prefill and decode
tokens/s, then for each concurrency level TTFT p50, TTFT p99 and total output tokens/s, each with
`_min` and `_max` over the repeats. An empty cell is a figure that was not measured (so is a
standard deviation when llama-bench ran only once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from quantload.analysis.load_run import RunData

LOAD_FIGURES: tuple[str, ...] = ("ttft_p50_s", "ttft_p99_s", "output_tok_s")


def level_column(metric: str, users: int) -> str:
    """'ttft_p50_s_at_4_users'."""
    return f"{metric}_at_{users}_users"


def users_levels(run: RunData, levels: pd.DataFrame) -> list[int]:
    """Configured levels and measured ones, ascending."""
    configured = [int(u) for u in run.setting("load", "users") or [] if isinstance(u, int)]
    measured = [int(u) for u in levels["users"].dropna()] if not levels.empty else []
    return sorted(set(configured) | set(measured))


def _file_size(run: RunData, quant: str) -> int | None:
    if run.manifest is not None and quant in run.manifest.files:
        return run.manifest.files[quant].size_bytes
    if run.quality is not None and quant in run.quality.results:
        return run.quality.results[quant].model_size_bytes
    return None


def seed_table(run: RunData, levels: pd.DataFrame, quants: Sequence[str]) -> pd.DataFrame:
    """The table (see the module docstring); quants in the run's order."""
    users = users_levels(run, levels)
    rows = []
    for quant in quants:
        quality = run.quality.results.get(quant) if run.quality else None
        speed = run.speed.results.get(quant) if run.speed else None
        repeated = speed is not None and speed.bench.reps > 1  # one repetition has no spread to show
        row: dict[str, Any] = {
            "quant": quant,
            "file_size_bytes": _file_size(run, quant),
            "perplexity": quality.perplexity if quality else None,
            "perplexity_error": quality.perplexity_error if quality else None,
            "prefill_tok_s": speed.bench.prefill.tokens_per_s if speed else None,
            "prefill_stddev_tok_s": speed.bench.prefill.stddev_tokens_per_s if speed and repeated else None,
            "decode_tok_s": speed.bench.decode.tokens_per_s if speed else None,
            "decode_stddev_tok_s": speed.bench.decode.stddev_tokens_per_s if speed and repeated else None,
        }
        mine = levels[levels["quant"] == quant] if not levels.empty else levels
        for level in users:
            found = mine[mine["users"] == level].to_dict("records") if not mine.empty else []
            source = found[0] if found else {}
            for metric in LOAD_FIGURES:
                for suffix in ("", "_min", "_max"):
                    value = source.get(f"{metric}{suffix}")
                    row[level_column(metric, level) + suffix] = (
                        None if value is None or pd.isna(value) else value
                    )
        rows.append(row)
    return pd.DataFrame(rows)
