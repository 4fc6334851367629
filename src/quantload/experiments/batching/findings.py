"""What the report computes of the batching experiment (its `Analysis.findings` entry: its table and
verdict, experiments.table_findings) and what it adds to summary.json's `server_flags`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from quantload.analysis.report_input import ReportInput
from quantload.experiments.batching.stages import NAME
from quantload.experiments.batching.tables import batching_table, batching_verdict
from quantload.experiments.table_findings import TableFindings, findings_in, table_summary

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


class BatchingFindings(TableFindings):
    """The batching table (tables.batching_table) and its verdict."""


def batching_findings(given: ReportInput) -> BatchingFindings:
    """The batching table of the run and its one-sentence verdict (an empty table where it has no
    stage of the experiment)."""
    run = given.run
    table = batching_table(run.records, given.stages, given.quants)
    return BatchingFindings(table, batching_verdict(table))


def findings_of(analysis: Analysis) -> BatchingFindings:
    """The batching findings in `analysis` (empty ones where it holds none)."""
    return findings_in(analysis, NAME, BatchingFindings, batching_verdict)


def summary_keys(found: BatchingFindings) -> Mapping[str, Any]:
    """Its key of summary.json's `server_flags`: `batching` with the table's rows and the verdict."""
    return table_summary(NAME, found)
