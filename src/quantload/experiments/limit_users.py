"""The limit search over users: the most concurrent users that hold the SLO (closed loop).

Trials at growing user counts, then bisected, the answer confirmed by a majority of repeats
([limit]; quantload.load.limit_search has the rules, limit_trials how each trial runs and is
judged).
"""

from __future__ import annotations

from typing import Final

from quantload.experiments.base import Experiment, ExperimentContext, ExperimentRun
from quantload.experiments.limit_trials import search_run

NAME: Final = "limit_users"


def run(context: ExperimentContext) -> ExperimentRun:
    return search_run(NAME, context)


EXPERIMENT = Experiment(
    name=NAME,
    title="limit search, users {quant}",
    step="limit_users",
    chapter="load",
    summary="the most concurrent users within the SLO ([limit])",
    missing=lambda settings: None,
    run=run,
    searches=True,
)
