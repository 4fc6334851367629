"""The SLO's flags, the same on every command that judges a level (run, load, tune, report)."""

from __future__ import annotations

from typing import Any

import typer

from quantload.config import ResolvedConfig

PERCENTILE_HELP = "p50, p90, p95, p99 or p99.9"

SLO_TTFT = typer.Option(None, "--slo-ttft", help="TTFT limit, s [1.0].")
SLO_TTFT_PERCENTILE = typer.Option(
    None,
    "--slo-ttft-percentile",
    help=f"The share of requests the TTFT limit holds for: {PERCENTILE_HELP}; default p99.",
)
SLO_TPOT = typer.Option(None, "--slo-tpot", help="TPOT limit, s [0.1].")
SLO_TPOT_PERCENTILE = typer.Option(
    None, "--slo-tpot-percentile", help=f"The TPOT limit's percentile: {PERCENTILE_HELP}; default p99."
)
CONFIDENCE = typer.Option(
    None, "--confidence", help="How sure a verdict must be, between 0.5 and 0.999 [0.95]."
)
SLO_KEYS = (
    "slo.ttft_s", "slo.ttft_percentile", "slo.tpot_s", "slo.tpot_percentile", "slo.max_failed_frac",
    "slo.confidence", "slo.burst_requests",
)  # fmt: skip


def slo_flags(
    ttft_s: float | None,
    ttft_percentile: str | None,
    tpot_s: float | None,
    tpot_percentile: str | None,
    confidence: float | None,
) -> dict[str, Any]:
    """The flags as configuration keys (None: not given)."""
    return {
        "slo.ttft_s": ttft_s,
        "slo.ttft_percentile": ttft_percentile,
        "slo.tpot_s": tpot_s,
        "slo.tpot_percentile": tpot_percentile,
        "slo.confidence": confidence,
    }


def slo_given(config: ResolvedConfig) -> bool:
    """Whether any SLO setting comes from the user (a file, the environment, a flag) rather than
    the defaults or a profile: a report then judges against it instead of the run's own SLO."""
    return any(
        config.source_of(key) != "default" and not config.source_of(key).startswith("profile:")
        for key in SLO_KEYS
    )
