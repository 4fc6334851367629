"""The concurrency sweep: closed loop, the same requests at each of `load.users`, repeated.

The whole sweep is repeated `load.repeats` times (repeat-major, so slow drift spreads over all
levels). Each level is decided as it goes (quantload.slo): its stages (one per repeat) send their
requests, and the same again while the level is undecided and `slo.level_max_requests` and
`slo.level_max_s` last; a level that misses stops after a request per user.

It sends `workload.kind`'s requests: `load.prompt_count` of the prompt set (cycled when
the set is smaller), `workload.requests` of the other kinds, `sessions.count` conversations for
the sessions workload. Every request sends `cache_prompt` as configured (off by default, so
repeated prompts are not served from the prompt cache).
"""

from __future__ import annotations

from quantload.config import LoadSettings, Settings, SloSettings
from quantload.experiments.base import Experiment, ExperimentContext, ExperimentRun, experiment_run
from quantload.experiments.running import invocation_id, run_stages, workloads
from quantload.load.plan import (
    LoadPlan,
    StagePlan,
    assemble_plan,
    decided_timeout_s,
    stage_decision,
    stage_plan,
)
from quantload.load.workloads import StageRequests
from quantload.served import ServedTarget

NAME = "sweep"


def requests_per_stage(settings: Settings) -> int:
    """How many requests a closed-loop stage of `workload.kind` sends."""
    return settings.load.prompt_count if settings.workload.kind == "prompts" else settings.workload.requests


def sweep_plan(
    load: LoadSettings,
    target: ServedTarget,
    drawn: StageRequests,
    run_id: str,
    invocation: str,
    slo: SloSettings | None = None,
) -> LoadPlan:
    """Closed loop: `drawn` at each user level, the whole sweep repeated; each level decided
    under `slo` (None: not decided, the stages send `drawn` once)."""
    stages: list[StagePlan] = []
    timeout_s = decided_timeout_s(load.stage_timeout_s, slo) if slo is not None else None
    for repeat in range(load.repeats):
        for users in load.users:
            decision = stage_decision(slo, f"{invocation}-u{users}", users) if slo is not None else None
            stages.append(
                stage_plan(
                    load, invocation, len(stages), NAME, users, drawn, repeat=repeat, timeout_s=timeout_s,
                    decision=decision,
                )
            )
    return assemble_plan(load, target, run_id, invocation, [drawn], stages)


def run(context: ExperimentContext) -> ExperimentRun:
    settings, target = context.settings, context.target
    invocation = invocation_id(NAME, target)
    with workloads(context) as builder:
        workload = builder.workload()
        count = settings.sessions.count if workload.name == "sessions" else requests_per_stage(settings)
        drawn = workload.stage_requests(count, settings.load.seed, f"{invocation}-")
    plan = sweep_plan(settings.load, target, drawn, context.run.run_id, invocation, settings.slo)
    outcome = run_stages(context, plan)
    return experiment_run(NAME, outcome.summaries)


EXPERIMENT = Experiment(
    name=NAME,
    title="load sweep {quant}",
    step="load",
    chapter="load",
    summary="closed loop at each of load.users, with workload.kind's requests",
    missing=lambda settings: None,
    run=run,
)
