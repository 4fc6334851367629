"""What the report computes of the noisy neighbour (its `Analysis.findings` entry) and what it adds
to summary.json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from quantload.analysis.report_input import ReportInput
from quantload.experiments.noisy_neighbour.stages import NAME
from quantload.experiments.noisy_neighbour.tables import (
    NoisyVerdict,
    noisy_table,
    noisy_verdicts,
    tenant_table,
)

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


@dataclass(frozen=True)
class NoisyNeighbourFindings:
    """Every tenant's figures per stage, the figures per neighbour load, and the verdicts."""

    tenants: pd.DataFrame  # tables.tenant_table
    steps: pd.DataFrame  # tables.noisy_table
    verdicts: tuple[NoisyVerdict, ...]


def noisy_neighbour_findings(given: ReportInput) -> NoisyNeighbourFindings:
    """The tables and verdicts of the run's tenants and its noisy-neighbour stages (empty where it
    has none)."""
    run, settings = given.run, given.run.settings
    steps = noisy_table(run.records, given.stages, settings, given.slo, given.quants)
    return NoisyNeighbourFindings(
        tenants=tenant_table(run.records, given.stages, settings, given.slo),
        steps=steps,
        verdicts=tuple(noisy_verdicts(steps, settings, given.plan)),
    )


def findings_of(analysis: Analysis) -> NoisyNeighbourFindings:
    """The noisy neighbour's findings in `analysis` (empty ones where it holds none)."""
    found = analysis.findings.get(NAME)
    if isinstance(found, NoisyNeighbourFindings):
        return found
    return NoisyNeighbourFindings(pd.DataFrame(), pd.DataFrame(), ())


def summary_keys(found: NoisyNeighbourFindings) -> Mapping[str, Any]:
    """Its keys of summary.json, named as before the experiment had a folder of its own: `tenants`
    (tables.tenant_table's rows), `noisy_neighbour` (tables.noisy_table's) and `noisy_verdicts`
    (NoisyVerdict.to_dict); the report makes them JSON-safe."""
    return {
        "tenants": found.tenants.to_dict("records"),
        "noisy_neighbour": found.steps.to_dict("records"),
        "noisy_verdicts": [verdict.to_dict() for verdict in found.verdicts],
    }
