"""What the report computes of the speculation experiment (its `Analysis.findings` entry) and what it
adds to summary.json's `server_flags`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from quantload.analysis.report_input import ReportInput
from quantload.experiments.speculation.stages import NAME
from quantload.experiments.speculation.tables import speculation_table, speculation_verdict

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


@dataclass(frozen=True)
class SpeculationFindings:
    """The speculation table (tables.speculation_table) and its verdict."""

    table: pd.DataFrame  # tables.speculation_table
    verdict: str


def speculation_findings(given: ReportInput) -> SpeculationFindings:
    """The speculation table of the run and its one-sentence verdict (an empty table where it has no
    stage of the experiment)."""
    run = given.run
    table = speculation_table(run.records, given.stages, given.variants, given.quants)
    return SpeculationFindings(table, speculation_verdict(table))


def findings_of(analysis: Analysis) -> SpeculationFindings:
    """The speculation findings in `analysis` (empty ones where it holds none)."""
    found = analysis.findings.get(NAME)
    if isinstance(found, SpeculationFindings):
        return found
    empty = pd.DataFrame()
    return SpeculationFindings(empty, speculation_verdict(empty))


def summary_keys(found: SpeculationFindings) -> Mapping[str, Any]:
    """Its key of summary.json's `server_flags`, named as before the experiment had a folder of its
    own: `speculation` with the table's rows and the verdict (the report makes them JSON-safe)."""
    return {
        NAME: {
            "rows": found.table.to_dict("records") if not found.table.empty else [],
            "verdict": found.verdict,
        }
    }
