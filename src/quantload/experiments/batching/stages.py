"""The batching experiment's stages: the same requests on the server restarted with -cb and with
-nocb, closed loop at the limit and Poisson near it, run through the load supervisor (the
experiment as a whole: the package docstring)."""

from __future__ import annotations

from quantload.config import Settings
from quantload.errors import ConfigError
from quantload.experiments.at_limit import users_at_limit
from quantload.experiments.base import (
    ExperimentContext,
    ExperimentRun,
    ServerFlags,
    experiment_run,
)
from quantload.experiments.running import invocation_id, run_stages, workloads
from quantload.experiments.variant_file import append_variant, variant_line
from quantload.load.plan import LoadPlan, assemble_plan, poisson_requests, stage_plan
from quantload.load.summary import StageSummary
from quantload.load.workloads import StageRequests
from quantload.served import ServedTarget

NAME = "batching"
CONTINUOUS = ServerFlags(extra_args=("-cb",), label="-cb")
STATIC = ServerFlags(extra_args=("-nocb",), label="-nocb")
STATE = "cache_prompt off; {mode} batching"


def batching_plan(
    settings: Settings,
    target: ServedTarget,
    drawn: StageRequests,
    flags: ServerFlags,
    users: int,
    rate_rps: float | None,
    run_id: str,
    invocation: str,
    repeat: int,
) -> LoadPlan:
    """One closed-loop stage at `users`, or (with `rate_rps`) one Poisson stage, under `flags`."""
    load, batching = settings.load, settings.batching
    state = STATE.format(mode="static" if flags is STATIC else "continuous")
    if rate_rps is None:
        stage = stage_plan(
            load,
            invocation,
            0,
            NAME,
            users,
            drawn,
            repeat=repeat,
            cache_prompt=False,
            timeout_s=batching.stage_timeout_s,
            phase="closed",
            server_args=flags.label,
            server_state=state,
        )
    else:
        stage = stage_plan(
            load,
            invocation,
            0,
            NAME,
            load.open_loop_users,
            drawn,
            arrival="poisson",
            rate_rps=rate_rps,
            requests=poisson_requests(drawn, rate_rps, load.seed + repeat),
            repeat=repeat,
            cache_prompt=False,
            timeout_s=batching.stage_timeout_s,
            phase="poisson",
            server_args=flags.label,
            server_state=state,
        )
    return assemble_plan(load, target, run_id, invocation, [drawn], [stage])


def _stages(
    context: ExperimentContext,
    target: ServedTarget,
    drawn: StageRequests,
    flags: ServerFlags,
    users: int,
    rate_rps: float | None,
) -> list[StageSummary]:
    summaries: list[StageSummary] = []
    for repeat in range(context.settings.batching.repeats):
        invocation = f"{invocation_id(NAME, target)}-{'p' if rate_rps else 'c'}"
        plan = batching_plan(
            context.settings, target, drawn, flags, users, rate_rps, context.run.run_id, invocation, repeat
        )
        summaries += run_stages(context, plan).summaries
    return summaries


def continuous_rate_rps(summaries: list[StageSummary]) -> float | None:
    """The requests/s the continuous server completed in its closed-loop stages (their median)."""
    rates = sorted(s.requests_per_s for s in summaries if s.status == "ok" and s.requests_per_s)
    return rates[len(rates) // 2] if rates else None


def run(context: ExperimentContext) -> ExperimentRun:
    settings = context.settings
    batching = settings.batching
    if context.servers is None:
        raise ConfigError(
            "the batching experiment restarts llama-server with -cb and -nocb",
            "run it through `quantload run`",
        )
    at_limit = users_at_limit(context, batching.users, NAME)
    summaries: list[StageSummary] = []
    users = at_limit.users
    context.run.progress(0, None, f"{context.target.name} batching at {users} users ({at_limit.source})")
    with workloads(context) as builder:
        count = max(batching.requests, 2 * users)
        drawn = builder.workload().stage_requests(count, settings.load.seed, f"{NAME}-")
    rate_rps: float | None = None
    for flags in (CONTINUOUS, STATIC):
        with context.servers.variant(flags) as variant:
            closed = _stages(context, variant.target, drawn, flags, users, None)
            summaries += closed
            if flags is CONTINUOUS:
                measured = continuous_rate_rps(closed)
                rate_rps = measured * batching.rate_frac if measured else None
            if rate_rps is not None:
                summaries += _stages(context, variant.target, drawn, flags, users, rate_rps)
            append_variant(context.run.run_dir, variant_line(context.run.run_id, NAME, variant))
    if rate_rps is None:
        context.run.warn(
            f"batching: the continuous server completed no closed-loop stage at {users} users,"
            " so there is no rate to send Poisson arrivals at"
        )
    return at_limit.with_search_time(experiment_run(NAME, summaries))
