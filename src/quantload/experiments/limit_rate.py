"""The limit search over the arrival rate: the highest rate that holds the SLO (open loop).

Trials at growing rates (Poisson arrivals, or a trace's own), then bisected geometrically to
`limit.rate_resolution`, the answer confirmed by a majority of repeats ([limit];
quantload.load.limit_search has the rules, limit_trials how each trial runs and is judged).
"""

from __future__ import annotations

from typing import Final

from quantload.experiments.base import Experiment, ExperimentContext, ExperimentRun
from quantload.experiments.limit_trials import search_run

NAME: Final = "limit_rate"


def run(context: ExperimentContext) -> ExperimentRun:
    return search_run(NAME, context)


EXPERIMENT = Experiment(
    name=NAME,
    title="limit search, rate {quant}",
    step="limit_rate",
    chapter="load",
    summary="the highest arrival rate within the SLO ([limit])",
    missing=lambda settings: None,
    run=run,
    searches=True,
)
