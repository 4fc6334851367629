"""The soak's part of the report (ExperimentReport): its findings, its chapter, its key of
summary.json, and what it could not measure."""

from __future__ import annotations

from quantload.experiments.base import ExperimentReport
from quantload.experiments.soak.chapter import CHAPTER
from quantload.experiments.soak.findings import SoakFindings, soak_findings, summary_keys

REPORT = ExperimentReport[SoakFindings](
    findings=soak_findings,
    chapter=CHAPTER,
    summary=summary_keys,
    subject=None,  # its findings file their own note where the settings asked for a soak and none ran
    gap_section="soak",
    gaps=lambda given, found: found.gaps,
    notes=lambda found: found.notes,
)
