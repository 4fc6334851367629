"""The ramp-up's stages: one timed closed-loop stage per step, each at one user more than the one
before, planned and run through the load supervisor one step at a time, so that the ramp can stop
after the first step that misses the SLO (the experiment as a whole: the package docstring)."""

from __future__ import annotations

import dataclasses
from typing import Final

from quantload.config import Settings
from quantload.experiments.base import ExperimentContext, ExperimentRun, experiment_run
from quantload.experiments.running import invocation_id, run_stages, workloads
from quantload.experiments.sweep import requests_per_stage
from quantload.load.plan import LoadPlan, assemble_plan, stage_plan
from quantload.load.summary import StageSummary
from quantload.load.workloads import StageRequests
from quantload.served import ServedTarget
from quantload.slo import Slo, Verdict, judge

NAME: Final = "ramp_up"
STEP_MARGIN_S = 60.0  # a step's bound beyond its length and one request's deadline


def missing(settings: Settings) -> str | None:
    """The ramp-up needs nothing beyond its section's defaults."""
    return None


def step_users(settings: Settings) -> list[int]:
    """The users of each step, in order: `ramp_up.start_users` up to `ramp_up.max_users`, one more
    each step."""
    ramp = settings.ramp_up
    return list(range(ramp.start_users, ramp.max_users + 1))


def step_phase(step: int, steps: int) -> str:
    """A step's phase label ('step 3/8'), 1-based: how the report finds its number."""
    return f"step {step}/{steps}"


def step_plan(
    settings: Settings,
    target: ServedTarget,
    pool: StageRequests,
    index: int,
    run_id: str,
    invocation: str,
) -> LoadPlan:
    """The plan of step `index` (0-based): one timed stage of `ramp_up.step_s` at its users, the
    pool's requests handed out again and again until its time is up (only the first step has
    warm-up requests). Every step of one ramp shares the invocation: its stage ids are
    `<invocation>-<index>`."""
    load, ramp = settings.load, settings.ramp_up
    users = step_users(settings)
    stage = stage_plan(
        load, invocation, index, NAME, users[index], pool,
        warmup=None if index == 0 else (),
        timeout_s=ramp.step_s + load.request_timeout_s + STEP_MARGIN_S,
        duration_s=ramp.step_s, phase=step_phase(index + 1, len(users)),
        server_state=f"ramp-up at {users[index]} users",
    )  # fmt: skip
    return assemble_plan(load, target, run_id, invocation, [pool], [stage])


def draw_pool(context: ExperimentContext, invocation: str) -> StageRequests:
    """The ramp's requests, the same at every step: as many as a sweep stage sends and at least
    one per user of the last step, without the send times a trace brings (the users send them as
    fast as they are answered)."""
    settings = context.settings
    with workloads(context) as builder:
        workload = builder.workload()
        count = settings.sessions.count if workload.name == "sessions" else requests_per_stage(settings)
        drawn = workload.stage_requests(
            max(count, settings.ramp_up.max_users, 1), settings.load.seed, f"{invocation}-"
        )
    if any(request.offset_s is not None for request in drawn.requests):
        plain = tuple(request.model_copy(update={"offset_s": None}) for request in drawn.requests)
        drawn = dataclasses.replace(drawn, requests=plain)
    return drawn


def step_verdict(summary: StageSummary, slo: Slo) -> Verdict:
    """A step's verdict against the SLO: quantload.slo's judge on its counts, as every level gets
    it (its users the prior of the design effect; a busy machine or an untrusted client as the
    judge takes them)."""
    return judge(
        summary.counts, slo, summary.users, machine_busy=summary.machine_busy,
        client_untrusted=summary.client_untrusted,
    )  # fmt: skip


def ends_the_ramp(summary: StageSummary | None, slo: Slo) -> str | None:
    """Why the ramp stops after this step (it missed the SLO, or its stage did not end ok), or
    None to go on."""
    if summary is None:
        return "its stage never ended"
    if summary.status != "ok":
        return f"its stage {summary.status}: {summary.reason}"
    verdict = step_verdict(summary, slo)
    return f"it {verdict.text()}" if verdict.misses else None


def run(context: ExperimentContext) -> ExperimentRun:
    settings, target, run_ctx = context.settings, context.target, context.run
    invocation = invocation_id(NAME, target)
    pool = draw_pool(context, invocation)
    users = step_users(settings)
    summaries: list[StageSummary] = []
    for index, count in enumerate(users):
        note = f"{target.name}: ramp-up step {index + 1}/{len(users)} at {count} users"
        run_ctx.progress(index, len(users), note)
        plan = step_plan(settings, target, pool, index, run_ctx.run_id, invocation)
        quiet = context if index == 0 else _quiet(context)  # the plan's warnings once per ramp
        done = run_stages(quiet, plan).summaries
        summaries += done
        why = ends_the_ramp(done[0] if done else None, run_ctx.slo)
        if why is not None:
            run_ctx.progress(len(users), len(users), f"{target.name}: ramp-up stops at {count} users: {why}")
            break
    else:
        last = f"{target.name}: ramp-up reached ramp_up.max_users without a miss"
        run_ctx.progress(len(users), len(users), last)
    return experiment_run(NAME, summaries)


def _quiet(context: ExperimentContext) -> ExperimentContext:
    return dataclasses.replace(context, run=dataclasses.replace(context.run, warn=lambda line: None))
