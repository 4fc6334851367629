"""What the report computes of the speculation experiment (its `Analysis.findings` entry: its table and
verdict, experiments.table_findings) and what it adds to summary.json's `server_flags`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from quantload.analysis.report_input import ReportInput
from quantload.experiments.speculation.stages import NAME
from quantload.experiments.speculation.tables import speculation_table, speculation_verdict
from quantload.experiments.table_findings import TableFindings, findings_in, table_summary

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


class SpeculationFindings(TableFindings):
    """The speculation table (tables.speculation_table) and its verdict."""


def speculation_findings(given: ReportInput) -> SpeculationFindings:
    """The speculation table of the run and its one-sentence verdict (an empty table where it has no
    stage of the experiment)."""
    run = given.run
    table = speculation_table(run.records, given.stages, given.variants, given.quants)
    return SpeculationFindings(table, speculation_verdict(table))


def findings_of(analysis: Analysis) -> SpeculationFindings:
    """The speculation findings in `analysis` (empty ones where it holds none)."""
    return findings_in(analysis, NAME, SpeculationFindings, speculation_verdict)


def summary_keys(found: SpeculationFindings) -> Mapping[str, Any]:
    """Its key of summary.json's `server_flags`: `speculation` with the table's rows and the verdict."""
    return table_summary(NAME, found)
