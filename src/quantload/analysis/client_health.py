"""Whether the load generator kept up: stages where its own send lag or saturation flags it."""

from __future__ import annotations

import pandas as pd

from quantload.analysis import fmt


def lagging_stages(stages: pd.DataFrame, threshold_s: float) -> pd.DataFrame:
    """Stages whose send-lag p99 is above `threshold_s` or whose stage_end says the client saturated."""
    if stages.empty:
        return stages
    lag = stages["lag_p99_s"].astype(float).fillna(0.0)
    saturated = stages["client_saturated"].eq(True)
    flagged = stages[(lag > threshold_s) | saturated].copy()
    flagged["why"] = [
        "; ".join(
            part
            for part in (
                f"send lag p99 {fmt.duration(row.lag_p99_s)} > {fmt.duration(threshold_s)}"
                if (row.lag_p99_s or 0.0) > threshold_s
                else "",
                "stage_end says the client saturated (CPU or event-loop lag)" if row.client_saturated else "",
            )
            if part
        )
        for row in flagged.itertuples()
    ]
    return flagged


def client_verdict(stages: pd.DataFrame, flagged: pd.DataFrame, threshold_s: float) -> str:
    """One sentence on the load generator's health."""
    if stages.empty:
        return "not measured: no load stages"
    worst = stages["lag_p99_s"].astype(float).max()
    if flagged.empty:
        return (
            f"The load generator kept up in every stage: send lag p99 at most {fmt.duration(worst)}"
            f" (threshold {fmt.duration(threshold_s)}), no stage reported saturation."
        )
    return (
        f"The load generator lagged in {len(flagged)} of {len(stages)} stage(s): their latencies include"
        " client delay and understate what the server could do; rerun with more Locust workers"
        " (load.workers) or on a machine with spare cores."
    )
