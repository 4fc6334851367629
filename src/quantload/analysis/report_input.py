"""What the report step hands an experiment's own part of the report (ExperimentReport.findings):
the run's data and what the report has computed of it before."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from quantload.analysis.capacity_plan import CapacityPlan
from quantload.analysis.run_data import RunData
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
