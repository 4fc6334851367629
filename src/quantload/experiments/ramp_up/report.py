"""The ramp-up's part of the report (ExperimentReport): its findings, its chapter, its key of
summary.json."""

from __future__ import annotations

from quantload.experiments.base import ExperimentReport
from quantload.experiments.ramp_up.chapter import CHAPTER
from quantload.experiments.ramp_up.findings import RampUpFindings, ramp_up_findings, summary_keys

REPORT = ExperimentReport[RampUpFindings](
    findings=ramp_up_findings,
    chapter=CHAPTER,
    summary=summary_keys,
    subject="the ramp-up",
    gap_section="ramp_up",
    follows="load",
)
