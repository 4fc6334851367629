"""What the report computes of the open loop (its `Analysis.findings` entry) and what it adds to
summary.json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from quantload.analysis.report_input import ReportInput
from quantload.analysis.stage_tables import level_table
from quantload.experiments.open_loop.stages import NAME

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


@dataclass(frozen=True)
class OpenLoopFindings:
    """Its levels: one row per quantization and rate, medians of the repeats."""

    levels: pd.DataFrame  # stage_tables.level_table keyed by rate_rps


def open_loop_findings(given: ReportInput) -> OpenLoopFindings:
    """The levels of the run's open-loop stages (an empty table where it has none)."""
    run = given.run
    return OpenLoopFindings(level_table(given.stages, NAME, "rate_rps", given.quants, run.records, given.slo))


def findings_of(analysis: Analysis) -> OpenLoopFindings:
    """The open loop's findings in `analysis` (an empty table where it holds none)."""
    found = analysis.findings.get(NAME)
    return found if isinstance(found, OpenLoopFindings) else OpenLoopFindings(pd.DataFrame())


def summary_keys(found: OpenLoopFindings) -> Mapping[str, Any]:
    """Its key of summary.json, named as before the experiment had a folder of its own:
    `open_loop_levels`, the levels' rows; the report makes them JSON-safe."""
    return {"open_loop_levels": found.levels.to_dict("records") if not found.levels.empty else []}
