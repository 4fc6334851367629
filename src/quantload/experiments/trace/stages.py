"""The trace replay's stage: the trace's requests sent open loop at their arrival times divided by
`trace.speed` (the experiment as a whole: the package docstring)."""

from __future__ import annotations

from quantload.config import Settings
from quantload.errors import ConfigError
from quantload.experiments.base import ExperimentContext, ExperimentRun, experiment_run
from quantload.experiments.running import invocation_id, run_stages, workloads
from quantload.load.plan import LoadPlan, assemble_plan, stage_plan
from quantload.load.workloads import StageRequests
from quantload.served import ServedTarget

NAME = "trace"


def missing(settings: Settings) -> str | None:
    return None if settings.trace.path else "no trace (trace.path)"


def trace_plan(
    settings: Settings, target: ServedTarget, drawn: StageRequests, run_id: str, invocation: str
) -> LoadPlan:
    """The trace replayed open loop; `drawn` carries the send offsets (at `trace.speed`). A replay
    whose last send would come after load.stage_timeout_s is refused before it starts."""
    load, speed = settings.load, settings.trace.speed
    last = max((r.offset_s or 0.0 for r in drawn.requests), default=0.0)
    if last > load.stage_timeout_s:
        raise ConfigError(
            f"the trace's last request would be sent {last:,.0f} s into the replay at speed x{speed:g},"
            f" after load.stage_timeout_s = {load.stage_timeout_s:,.0f} s ends the stage",
            "replay it faster (--speed), keep fewer requests (trace.max_requests), or raise"
            " load.stage_timeout_s",
        )
    stage = stage_plan(
        load, invocation, 0, NAME, load.open_loop_users, drawn,
        arrival="trace",
        rate_rps=(len(drawn.requests) - 1) / last if last > 0 else float(len(drawn.requests)),
        phase=f"speed x{speed:g}",
        timeout_s=load.stage_timeout_s,
    )  # fmt: skip
    return assemble_plan(load, target, run_id, invocation, [drawn], [stage])


def run(context: ExperimentContext) -> ExperimentRun:
    settings, target = context.settings, context.target
    invocation = invocation_id(NAME, target)
    with workloads(context) as builder:
        workload = builder.trace_workload()
        drawn = workload.stage_requests(
            len(workload.trace), settings.load.seed, f"{invocation}-", speed=settings.trace.speed
        )
    plan = trace_plan(settings, target, drawn, context.run.run_id, invocation)
    return experiment_run(NAME, run_stages(context, plan).summaries)

