"""What the report computes of the ramp-up (its `Analysis.findings` entry): every ramp of the run;
and its key of summary.json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quantload.analysis.report_input import ReportInput
from quantload.experiments.ramp_up.stages import NAME
from quantload.experiments.ramp_up.tables import RampRun, ramp_runs

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


@dataclass(frozen=True)
class RampUpFindings:
    """Every ramp of the run, one per quantization and server it ran against."""

    runs: tuple[RampRun, ...] = ()


def ramp_up_findings(given: ReportInput) -> RampUpFindings:
    """Every ramp of the run's stages (tables.ramp_runs), judged against the run's SLO."""
    return RampUpFindings(ramp_runs(given.stages, given.slo, given.quants))


def findings_of(analysis: Analysis) -> RampUpFindings:
    """The ramp-up's findings in `analysis` (empty ones where it holds none)."""
    found = analysis.findings.get(NAME)
    return found if isinstance(found, RampUpFindings) else RampUpFindings()


def summary_keys(found: RampUpFindings) -> Mapping[str, Any]:
    """Its key of summary.json: `ramp_up`, one entry per ramp (RampRun.to_dict: where the SLO
    first breaks, held or became undecided, the sentence, every step); the report makes it
    JSON-safe."""
    return {"ramp_up": [run.to_dict() for run in found.runs]}
