"""The load step: one experiment of the registry (quantload.experiments.registry) against a served
target; what `quantload run` and `quantload load` both call."""

from __future__ import annotations

from quantload.errors import ConfigError
from quantload.experiments import registry
from quantload.experiments.base import ExperimentContext, ExperimentRun, ServerControl
from quantload.run_context import RunContext
from quantload.served import ServedTarget


def run_experiment(
    name: str, target: ServedTarget, context: RunContext, servers: ServerControl | None = None
) -> ExperimentRun:
    """Run one experiment's stages; records, stage lines and summaries are appended to the run
    directory as they come.

    `servers` controls the target's llama-server where quantload started it (an experiment that
    varies the server's flags needs it; None for a URL quantload was given).
    """
    experiment = registry.get(name)
    why = experiment.missing(context.settings)
    if why is not None:
        raise ConfigError(f"the {name} experiment cannot run: {why}", "set it, or leave the experiment out")
    if experiment.server_flags == "required" and servers is None:
        raise ConfigError(
            f"the {name} experiment starts llama-servers of its own with other flags",
            "run it through `quantload run`",
        )
    return experiment.run(ExperimentContext(context, target, servers))
