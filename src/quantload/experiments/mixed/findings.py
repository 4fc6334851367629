"""What the report computes of the mixed experiment (its `Analysis.findings` entry) and what it adds
to summary.json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from quantload.analysis.report_input import ReportInput
from quantload.experiments.mixed.stages import NAME
from quantload.experiments.mixed.tables import mixed_table, mixed_verdict

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


@dataclass(frozen=True)
class MixedFindings:
    """The decode-heavy requests' figures alone and mixed, per batch size, and the verdict."""

    table: pd.DataFrame  # tables.mixed_table
    verdict: str  # tables.mixed_verdict


def mixed_findings(given: ReportInput) -> MixedFindings:
    """The table and verdict of the run's complete mixed stages (an empty table and the "not
    measured" verdict where it has none); their inter-token gaps come from RunData.itl_by_request."""
    run = given.run
    table = mixed_table(run.records, given.stages, run.itl_by_request or {}, given.quants)
    return MixedFindings(table, mixed_verdict(table))


def findings_of(analysis: Analysis) -> MixedFindings:
    """The mixed experiment's findings in `analysis` (empty ones where it holds none)."""
    found = analysis.findings.get(NAME)
    if isinstance(found, MixedFindings):
        return found
    return MixedFindings(pd.DataFrame(), mixed_verdict(pd.DataFrame()))


def summary_keys(found: MixedFindings) -> Mapping[str, Any]:
    """Its keys of summary.json, named as before the experiment had a folder of its own: `mixed`
    (tables.mixed_table's rows) and `mixed_verdict` (the sentence); the report makes them
    JSON-safe."""
    return {"mixed": found.table.to_dict("records"), "mixed_verdict": found.verdict}
