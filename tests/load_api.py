"""Test shorthands for the load path: a run context over a folder, and the sweep, open loop and
prompt-cache plans of a given prompt list run through the real supervisor.

The experiments draw their prompts from `load.prompts`; tests that need a particular prompt list
(faults scripted into the fake server's prompts) build the same plans from it here and run them
with `run_plan`, so everything below the plan is the code a user runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from quantload.config import LoadSettings, Settings
from quantload.experiments.open_loop.stages import open_loop_plan
from quantload.experiments.running import invocation_id
from quantload.experiments.sweep import sweep_plan
from quantload.load.plan import LoadPlan
from quantload.load.processes import ProcessLayout
from quantload.load.prompts import Prompt
from quantload.load.summary import StageSummary
from quantload.load.supervisor import run_plan
from quantload.load.workloads import StageRequests
from quantload.progress import ProgressCallback, no_progress
from quantload.run_context import RunContext
from quantload.rundir.handle import RunDir
from quantload.served import ServedTarget


def context(
    run_dir: Path,
    load: LoadSettings | None = None,
    run_id: str = "run-1",
    progress: ProgressCallback = no_progress,
    **sections: Any,
) -> RunContext:
    """A run context writing into `run_dir`, with `load` and any other sections (by name) set. A
    level is decided within 5 s unless `slo` says otherwise (tests must not wait out the full
    profile's ten minutes on a level that stays undecided)."""
    sections.setdefault("slo", {"level_max_s": 5.0})
    settings = Settings.model_validate(
        {**({"load": load.model_dump()} if load is not None else {}), **sections}
    )
    return RunContext(RunDir(run_dir), run_id, settings, progress, cwd=run_dir)


def sweep_of(
    load: LoadSettings, target: ServedTarget, prompts: Sequence[Prompt], run_id: str = "run-1", invocation: str | None = None
) -> LoadPlan:
    """The sweep's plan of `prompts` (one request each, in order, at every level)."""
    drawn = StageRequests.of_prompts(prompts)
    return sweep_plan(load, target, drawn, run_id, invocation or invocation_id("sweep", target))


def open_loop_of(
    load: LoadSettings,
    target: ServedTarget,
    prompts: Sequence[Prompt],
    rates_rps: Sequence[float],
    run_id: str = "run-1",
    invocation: str | None = None,
) -> LoadPlan:
    """The open loop's plan: `load.open_loop_requests` arrivals cycling through `prompts` per rate."""
    chosen = [prompts[i % len(prompts)] for i in range(load.open_loop_requests)]
    drawn = StageRequests.of_prompts(chosen)
    return open_loop_plan(load, target, drawn, run_id, invocation or invocation_id("open_loop", target), rates_rps)


def run_sweep(
    target: ServedTarget,
    load: LoadSettings,
    run_dir: Path,
    run_id: str = "run-1",
    progress: ProgressCallback = no_progress,
    prompts: Sequence[Prompt] = (),
    layout: ProcessLayout | None = None,
) -> list[StageSummary]:
    """The sweep of `prompts` against `target`, through the real supervisor and Locust."""
    plan = sweep_of(load, target, prompts, run_id)
    return run_plan(plan, context(run_dir, load, run_id, progress), layout=layout).summaries


def run_open_loop(
    target: ServedTarget,
    load: LoadSettings,
    run_dir: Path,
    run_id: str = "run-1",
    progress: ProgressCallback = no_progress,
    rates_rps: Sequence[float] = (),
    prompts: Sequence[Prompt] = (),
) -> list[StageSummary]:
    """The open loop of `prompts` at `rates_rps`, through the real supervisor and Locust."""
    plan = open_loop_of(load, target, prompts, rates_rps or load.rates_rps, run_id)
    return run_plan(plan, context(run_dir, load, run_id, progress)).summaries


def settings_context(run_dir: Path, settings: Settings, run_id: str = "run-1") -> RunContext:
    """A run context with these whole settings, writing into `run_dir`."""
    return RunContext(RunDir(run_dir), run_id, settings, cwd=run_dir)


def experiment(
    name: str, target: ServedTarget, load: LoadSettings, run_dir: Path, run_id: str = "run-1", **sections: Any
) -> list[StageSummary]:
    """The registry's experiment `name` against `target` (no server control), its stage summaries."""
    from quantload.experiments.registry import run_experiment

    return list(run_experiment(name, target, context(run_dir, load, run_id, **sections)).summaries)
