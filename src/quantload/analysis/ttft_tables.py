"""Where TTFT goes, from the records and the stage table.

The split: llama-server's `timings.prompt_ms` runs from the moment a slot takes the request to the
end of the prompt; the client's TTFT runs from sending to the first generated text. The difference
is the time spent waiting for a slot, on the wire and in the server's HTTP layer.

Which TTFT a reasoning model gets: the first token of any kind beside the first answer content.
(The prompt-cache experiment's table is in its own folder under quantload.experiments.)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pandas as pd

from quantload.analysis.stage_tables import USABLE, sort_by_quant
from quantload.stats import percentile


def ttft_split_table(
    records: pd.DataFrame, stages: pd.DataFrame, experiment: str, quant_order: Sequence[str]
) -> pd.DataFrame:
    """Per (quant, users): TTFT, prefill and queueing+network p50/p99, pooled over complete repeats."""
    if stages.empty or records.empty:
        return pd.DataFrame()
    complete = stages[(stages["experiment"] == experiment) & stages["status"].isin(USABLE)]
    ids = set(complete["stage_id"].astype(str))
    chosen = records[records["stage_id"].isin(ids) & records["ok"] & ~records["warmup"]]
    chosen = chosen.dropna(subset=["ttft_s", "prompt_ms"])
    rows: list[dict[str, Any]] = []
    for (quant, users), group in chosen.groupby(["quant", "stage_users"], sort=False):
        prefill = group["prompt_ms"] / 1000.0
        queue = group["ttft_s"] - prefill
        ttft_p50 = percentile(group["ttft_s"], 50)
        queue_p50 = percentile(queue, 50)
        rows.append(
            {
                "quant": quant,
                "users": int(users),
                "requests": len(group),
                "ttft_p50_s": ttft_p50,
                "ttft_p99_s": percentile(group["ttft_s"], 99),
                "prefill_p50_s": percentile(prefill, 50),
                "prefill_p99_s": percentile(prefill, 99),
                "queue_network_p50_s": queue_p50,
                "queue_network_p99_s": percentile(queue, 99),
                "queue_share_p50": queue_p50 / ttft_p50 if queue_p50 is not None and ttft_p50 else None,
                "negative_queue": int((queue < 0).sum()),
            }
        )
    return sort_by_quant(pd.DataFrame(rows), quant_order, "users")


def reasoning_table(records: pd.DataFrame, quant_order: Sequence[str]) -> pd.DataFrame:
    """Per (quant, experiment) with reasoning chunks: TTFT (first token of any kind, reasoning
    included) beside the time to the first answer content, and how many requests got none."""
    if records.empty or "reasoning_chunks" not in records:
        return pd.DataFrame()
    measured = records[~records["warmup"] & records["ok"]]
    thinking = measured[measured["reasoning_chunks"].fillna(0) > 0]
    if thinking.empty:
        return pd.DataFrame()
    rows: list[dict[str, Any]] = []
    for (quant, experiment), group in thinking.groupby(["quant", "experiment"], sort=False):
        rows.append(
            {
                "quant": quant,
                "experiment": experiment,
                "requests": len(group),
                "reasoning_chunks_mean": float(group["reasoning_chunks"].mean()),
                "ttft_p50_s": percentile(group["ttft_s"], 50),
                "ttft_p99_s": percentile(group["ttft_s"], 99),
                "ttft_content_p50_s": percentile(group["ttft_content_s"], 50),
                "ttft_content_p99_s": percentile(group["ttft_content_s"], 99),
                "no_content": int(group["ttft_content_s"].isna().sum()),
            }
        )
    return sort_by_quant(pd.DataFrame(rows), quant_order, "experiment")
