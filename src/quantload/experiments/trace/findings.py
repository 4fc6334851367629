"""What the report computes of the trace replay (its `Analysis.findings` entry). It adds nothing to
summary.json: its stages' rows are in `stages` there."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from quantload.analysis.report_input import ReportInput
from quantload.experiments.trace.stages import NAME

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


@dataclass(frozen=True)
class TraceFindings:
    """The trace stages' rows of the stage table (stage_tables.stage_table), in its order."""

    stages: pd.DataFrame


def trace_findings(given: ReportInput) -> TraceFindings:
    """The run's trace stages (an empty table where it has none)."""
    stages = given.stages
    return TraceFindings(stages[stages["experiment"] == NAME] if not stages.empty else stages)


def findings_of(analysis: Analysis) -> TraceFindings:
    """The trace replay's findings in `analysis` (an empty table where it holds none)."""
    found = analysis.findings.get(NAME)
    return found if isinstance(found, TraceFindings) else TraceFindings(pd.DataFrame())


def summary_keys(found: TraceFindings) -> Mapping[str, Any]:
    """None: summary.json's `stages` holds its rows already."""
    return {}
