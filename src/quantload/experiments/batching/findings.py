"""What the report computes of the batching experiment (its `Analysis.findings` entry) and what it
adds to summary.json's `server_flags`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from quantload.analysis.report_input import ReportInput
from quantload.experiments.batching.stages import NAME
from quantload.experiments.batching.tables import batching_table, batching_verdict

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


@dataclass(frozen=True)
class BatchingFindings:
    """The batching table (tables.batching_table) and its verdict."""

    table: pd.DataFrame  # tables.batching_table
    verdict: str


def batching_findings(given: ReportInput) -> BatchingFindings:
    """The batching table of the run and its one-sentence verdict (an empty table where it has no
    stage of the experiment)."""
    run = given.run
    table = batching_table(run.records, given.stages, given.quants)
    return BatchingFindings(table, batching_verdict(table))


def findings_of(analysis: Analysis) -> BatchingFindings:
    """The batching findings in `analysis` (empty ones where it holds none)."""
    found = analysis.findings.get(NAME)
    if isinstance(found, BatchingFindings):
        return found
    empty = pd.DataFrame()
    return BatchingFindings(empty, batching_verdict(empty))


def summary_keys(found: BatchingFindings) -> Mapping[str, Any]:
    """Its key of summary.json's `server_flags`, named as before the experiment had a folder of its
    own: `batching` with the table's rows and the verdict (the report makes them JSON-safe)."""
    return {
        NAME: {
            "rows": found.table.to_dict("records") if not found.table.empty else [],
            "verdict": found.verdict,
        }
    }
