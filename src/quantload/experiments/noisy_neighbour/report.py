"""The noisy neighbour's part of the report (ExperimentReport): its findings, its chapter and its
keys of summary.json."""

from __future__ import annotations

from quantload.experiments.base import ExperimentReport
from quantload.experiments.noisy_neighbour.chapter import CHAPTER
from quantload.experiments.noisy_neighbour.findings import (
    NoisyNeighbourFindings,
    noisy_neighbour_findings,
    summary_keys,
)

REPORT = ExperimentReport[NoisyNeighbourFindings](
    findings=noisy_neighbour_findings,
    chapter=CHAPTER,
    summary=summary_keys,
    subject="the noisy neighbour",
    gap_section="tenants",
)
