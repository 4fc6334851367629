"""What the report computes of the slots experiment (its `Analysis.findings` entry: its table and
verdict, experiments.table_findings) and what it adds to summary.json's `server_flags`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from quantload.analysis.report_input import ReportInput
from quantload.experiments.slots.stages import NAME
from quantload.experiments.slots.tables import slots_table, slots_verdict
from quantload.experiments.table_findings import TableFindings, findings_in, table_summary

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


class SlotsFindings(TableFindings):
    """The slots table (tables.slots_table) and its verdict."""


def slots_findings(given: ReportInput) -> SlotsFindings:
    """The slots table of the run and its one-sentence verdict (an empty table where it has no
    stage of the experiment)."""
    run = given.run
    table = slots_table(run.limits, given.variants, dict(run.summaries), run.records, given.quants)
    return SlotsFindings(table, slots_verdict(table))


def findings_of(analysis: Analysis) -> SlotsFindings:
    """The slots findings in `analysis` (empty ones where it holds none)."""
    return findings_in(analysis, NAME, SlotsFindings, slots_verdict)


def summary_keys(found: SlotsFindings) -> Mapping[str, Any]:
    """Its key of summary.json's `server_flags`: `slots` with the table's rows and the verdict."""
    return table_summary(NAME, found)
