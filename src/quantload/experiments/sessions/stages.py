"""The sessions experiment's stages: conversations at `sessions.users` at once, one stage per cache
mode, repeated, drawn before any is sent and run through the load supervisor (the experiment as a
whole: the package docstring)."""

from __future__ import annotations

from collections.abc import Sequence

from quantload.config import Settings
from quantload.experiments.base import ExperimentContext, ExperimentRun, experiment_run
from quantload.experiments.running import invocation_id, run_stages, workloads
from quantload.load.plan import LoadPlan, StagePlan, assemble_plan, stage_plan
from quantload.load.workloads import StageRequests
from quantload.served import ServedTarget

NAME = "sessions"


def missing(settings: Settings) -> str | None:
    return None if settings.sessions.count > 0 else "sessions.count is 0"


def sessions_plan(
    settings: Settings,
    target: ServedTarget,
    drawn_per_mode: Sequence[tuple[bool, StageRequests]],
    run_id: str,
    invocation: str,
) -> LoadPlan:
    """Conversations at `sessions.users` at once, one stage per cache mode, `sessions.repeats` times."""
    load, sessions = settings.load, settings.sessions
    stages: list[StagePlan] = []
    for repeat in range(sessions.repeats):
        for cache_on, drawn in drawn_per_mode:
            stages.append(
                stage_plan(
                    load, invocation, len(stages), NAME, sessions.users, drawn,
                    repeat=repeat, cache_prompt=cache_on, phase=f"cache {'on' if cache_on else 'off'}",
                )
            )
    parts = [drawn for _, drawn in drawn_per_mode]
    return assemble_plan(load, target, run_id, invocation, parts, stages)


def run(context: ExperimentContext) -> ExperimentRun:
    settings, target = context.settings, context.target
    sessions, seed = settings.sessions, settings.load.seed
    invocation = invocation_id(NAME, target)
    with workloads(context) as builder:
        workload = builder.sessions()
        drawn = [
            (cache_on, workload.stage_requests(sessions.count, seed + index, f"{invocation}-m{index}-"))
            for index, cache_on in enumerate(sessions.cache_modes)
        ]
    plan = sessions_plan(settings, target, drawn, context.run.run_id, invocation)
    return experiment_run(NAME, run_stages(context, plan).summaries)
