"""The experiments, in the order `quantload run` runs them by default: the one list every part
reads (the run and its step names, `quantload load -e`, the config check, the report's "not run
because" lines, and the report's parts that experiments bring: `reported`).

Adding an experiment is one new folder of this package (or one module, for an experiment without a
part of its own in the report), declaring its `EXPERIMENT` (quantload.experiments.base.Experiment),
and one line below; its settings are one section of quantload.config.Settings.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

from quantload.config import Settings
from quantload.errors import ConfigError
from quantload.experiments import (
    batching,
    context,
    kv_types,
    limit_rate,
    limit_users,
    mixed,
    noisy_neighbour,
    open_loop,
    prefix_cache,
    ramp_up,
    sessions,
    slots,
    soak,
    speculation,
    sweep,
    trace,
)
from quantload.experiments.base import (
    Experiment,
    ExperimentContext,
    ExperimentReport,
    ExperimentRun,
    ServerControl,
)
from quantload.run_context import RunContext
from quantload.served import ServedTarget

REGISTRY: tuple[Experiment, ...] = (
    sweep.EXPERIMENT,
    prefix_cache.EXPERIMENT,
    open_loop.EXPERIMENT,
    sessions.EXPERIMENT,
    trace.EXPERIMENT,
    mixed.EXPERIMENT,
    limit_users.EXPERIMENT,
    limit_rate.EXPERIMENT,
    batching.EXPERIMENT,
    slots.EXPERIMENT,
    speculation.EXPERIMENT,
    context.EXPERIMENT,
    noisy_neighbour.EXPERIMENT,
    kv_types.EXPERIMENT,
    soak.EXPERIMENT,
    ramp_up.EXPERIMENT,
)


def names() -> tuple[str, ...]:
    """Every experiment's name, in the default order."""
    return tuple(experiment.name for experiment in REGISTRY)


# the experiments with a part of their own in the report, each with that part
ReportParts = tuple[tuple[Experiment, ExperimentReport[Any]], ...]


def report_part(experiment: Experiment) -> ExperimentReport[Any]:
    """The experiment's own part of the report: the REPORT of the module it names, loaded now."""
    if experiment.report is None:
        raise ValueError(f"the {experiment.name} experiment has no part of its own in the report")
    part = getattr(importlib.import_module(experiment.report), "REPORT", None)
    if not isinstance(part, ExperimentReport):
        raise TypeError(f"{experiment.report} has no REPORT of type ExperimentReport")
    return part


def reported() -> ReportParts:
    """The experiments with a part of their own in the report, each with that part, in the default
    order (the report step's one way to them: each part is loaded here, by its module's name)."""
    return tuple((e, report_part(e)) for e in REGISTRY if e.report is not None)


def default_names() -> tuple[str, ...]:
    """The experiments `load.experiments` names unless told otherwise, in order."""
    return tuple(experiment.name for experiment in REGISTRY if experiment.by_default)


def get(name: str) -> Experiment:
    """The experiment called `name`; ConfigError listing the known ones."""
    for experiment in REGISTRY:
        if experiment.name == name:
            return experiment
    raise ConfigError(f"unknown experiment {name!r}", f"choose from {', '.join(names())}")


def requested_names(settings: Settings) -> tuple[str, ...]:
    """The experiments `load.experiments` asks for, in its order (unset: the default ones);
    ConfigError for a name that is no experiment. The one check of those names: the CLI makes it
    as it reads the settings, before any work."""
    asked = settings.load.experiments
    if asked is None:
        return default_names()
    wrong = unknown(asked)
    if wrong:
        raise ConfigError(
            f"configuration key 'load.experiments': unknown experiment {wrong[0]!r}",
            f"choose from {', '.join(names())}",
        )
    return asked


def missing_input(name: str, settings: Settings) -> str | None:
    """Why the experiment `name` cannot run with these settings (the input it needs), or None."""
    return get(name).missing(settings)


def planned(settings: Settings) -> list[Experiment]:
    """The experiments the settings ask `quantload run` for, in its order: those of
    `load.experiments` whose input is there."""
    return [get(name) for name in requested_names(settings) if get(name).missing(settings) is None]


def for_any_server() -> tuple[str, ...]:
    """The experiments that can run against a server quantload did not start (all but those that
    must change its flags)."""
    return tuple(experiment.name for experiment in REGISTRY if experiment.server_flags != "required")


def against_any_server(requested: Sequence[str], settings: Settings | None = None) -> list[Experiment]:
    """The experiments `quantload load` may run against servers it did not start; ConfigError for
    an unknown name, one that needs to restart the server with other flags, and (given `settings`)
    one whose input is missing or that would measure nothing against such a server: all before
    any of them runs."""
    chosen = []
    for name in requested:
        experiment = get(name)
        if experiment.server_flags == "required":
            raise ConfigError(
                f"the {name} experiment starts llama-servers of its own with other flags",
                "run it through `quantload run`",
            )
        why = None if settings is None else experiment.missing(settings) or experiment.foreign(settings)
        if why is not None:
            hint = "set it, or leave the experiment out"
            raise ConfigError(f"the {name} experiment cannot run: {why}", hint)
        chosen.append(experiment)
    return chosen


def unknown(requested: Sequence[str]) -> list[str]:
    """The names of `requested` that are no experiment."""
    known = set(names())
    return [name for name in requested if name not in known]


def run_experiment(
    name: str, target: ServedTarget, context: RunContext, servers: ServerControl | None = None
) -> ExperimentRun:
    """Run one experiment's stages against a served target (what `quantload run` and `quantload
    load` both call); records, stage lines and summaries are appended to the run directory as they
    come.

    `servers` controls the target's llama-server where quantload started it (an experiment that
    varies the server's flags needs it; None for a URL quantload was given).
    """
    experiment = get(name)
    why = experiment.missing(context.settings)
    if why is not None:
        raise ConfigError(f"the {name} experiment cannot run: {why}", "set it, or leave the experiment out")
    if experiment.server_flags == "required" and servers is None:
        raise ConfigError(
            f"the {name} experiment starts llama-servers of its own with other flags",
            "run it through `quantload run`",
        )
    return experiment.run(ExperimentContext(context, target, servers))
