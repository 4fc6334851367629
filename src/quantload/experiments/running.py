"""What every experiment does the same way: name its invocation, read its workload, run its plan."""

from __future__ import annotations

import uuid

from quantload.experiments.base import ExperimentContext
from quantload.load.plan import LoadPlan
from quantload.load.supervisor import PlanOutcome, run_plan
from quantload.load.workload_builder import WorkloadBuilder
from quantload.served import ServedTarget


def label(name: str) -> str:
    """`name` cut to what a file name and a stage id may hold."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40]


def invocation_id(experiment: str, target: ServedTarget) -> str:
    """A fresh id for one experiment at one target: every stage id and log name starts with it."""
    return f"{experiment}-{label(target.name)}-{uuid.uuid4().hex[:6]}"


def workloads(context: ExperimentContext, target: ServedTarget | None = None) -> WorkloadBuilder:
    """The workloads of the context's target (or `target`), with files read from the run's folder."""
    return WorkloadBuilder(context.settings, target or context.target, context.run.cwd, context.run.progress)


def run_stages(context: ExperimentContext, plan: LoadPlan) -> PlanOutcome:
    """Say what is wrong with the plan (one warning line each), then run it."""
    for line in plan.warnings():
        context.run.warn(line)
    return run_plan(plan, context.run)
