"""What the report step hands an experiment's own part of the report (ExperimentReport.findings and
its notes): the run's data and what the report has computed of it before; and why an experiment
has no stages (`not_run_because`), for the report's "not measured" notes."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from quantload.analysis.capacity_plan import CapacityPlan
from quantload.analysis.run_data import RunData
from quantload.experiments.base import Experiment
from quantload.experiments.registry import requested_names
from quantload.experiments.variant_file import VariantLine
from quantload.slo import Slo


@dataclass(frozen=True)
class ReportInput:
    """The run, its stage table, the SLO it is judged against, its quantizations in report order,
    its capacity plan, and the server variants the flag experiments and the tune ran (variants.jsonl,
    read once by the report: its damaged lines are one note)."""

    run: RunData
    stages: pd.DataFrame  # stage_tables.stage_table
    slo: Slo
    quants: tuple[str, ...]
    plan: CapacityPlan
    variants: tuple[VariantLine, ...] = ()


def not_run_because(run: RunData, experiment: Experiment, quant: str | None, what_file: str) -> str:
    """Why an experiment has no stages: its input missing (the registry's reason), left out of
    load.experiments, or what run.json says of its step."""
    settings = run.settings
    if settings is not None:
        why = experiment.missing(settings)
        if why is not None:
            return f"not run because {why}"
        if experiment.name not in requested_names(settings):
            return f"not asked for (load.experiments leaves {experiment.name} out)"
    return run.step_why(experiment.step, quant, what_file)
