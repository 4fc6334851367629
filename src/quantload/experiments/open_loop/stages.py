"""The open loop's stages: one per rate of `load.rates_rps`, Poisson arrivals over one draw of
requests (the experiment as a whole: the package docstring)."""

from __future__ import annotations

from collections.abc import Sequence

from quantload.config import LoadSettings, Settings
from quantload.experiments.base import ExperimentContext, ExperimentRun, experiment_run
from quantload.experiments.running import invocation_id, run_stages, workloads
from quantload.load.plan import LoadPlan, assemble_plan, poisson_requests, stage_plan
from quantload.load.workloads import StageRequests
from quantload.served import ServedTarget

NAME = "open_loop"


def missing(settings: Settings) -> str | None:
    return None if settings.load.rates_rps else "no open-loop rate (load.rates_rps)"


def open_loop_plan(
    load: LoadSettings,
    target: ServedTarget,
    drawn: StageRequests,
    run_id: str,
    invocation: str,
    rates_rps: Sequence[float],
) -> LoadPlan:
    """One stage per rate, Poisson arrivals over `drawn`."""
    stages = [
        stage_plan(
            load, invocation, index, NAME, load.open_loop_users, drawn,
            arrival="poisson", rate_rps=rate, requests=poisson_requests(drawn, rate, load.seed + index),
        )
        for index, rate in enumerate(rates_rps)
    ]
    return assemble_plan(load, target, run_id, invocation, [drawn], stages)


def run(context: ExperimentContext) -> ExperimentRun:
    settings, target = context.settings, context.target
    load = settings.load
    invocation = invocation_id(NAME, target)
    with workloads(context) as builder:
        drawn = builder.workload().stage_requests(load.open_loop_requests, load.seed, f"{invocation}-")
    plan = open_loop_plan(load, target, drawn, context.run.run_id, invocation, load.rates_rps)
    return experiment_run(NAME, run_stages(context, plan).summaries)

