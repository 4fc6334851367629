"""What the report computes of the slots experiment (its `Analysis.findings` entry) and what it
adds to summary.json's `server_flags`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from quantload.analysis.report_input import ReportInput
from quantload.experiments.slots.stages import NAME
from quantload.experiments.slots.tables import slots_table, slots_verdict

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


@dataclass(frozen=True)
class SlotsFindings:
    """The slots table (tables.slots_table) and its verdict."""

    table: pd.DataFrame  # tables.slots_table
    verdict: str


def slots_findings(given: ReportInput) -> SlotsFindings:
    """The slots table of the run and its one-sentence verdict (an empty table where it has no
    stage of the experiment)."""
    run = given.run
    table = slots_table(run.limits, given.variants, dict(run.summaries), run.records, given.quants)
    return SlotsFindings(table, slots_verdict(table))


def findings_of(analysis: Analysis) -> SlotsFindings:
    """The slots findings in `analysis` (empty ones where it holds none)."""
    found = analysis.findings.get(NAME)
    if isinstance(found, SlotsFindings):
        return found
    empty = pd.DataFrame()
    return SlotsFindings(empty, slots_verdict(empty))


def summary_keys(found: SlotsFindings) -> Mapping[str, Any]:
    """Its key of summary.json's `server_flags`, named as before the experiment had a folder of its
    own: `slots` with the table's rows and the verdict (the report makes them JSON-safe)."""
    return {
        NAME: {
            "rows": found.table.to_dict("records") if not found.table.empty else [],
            "verdict": found.verdict,
        }
    }
