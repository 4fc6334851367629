"""The context experiment's part of the report (ExperimentReport): its findings, its chapter, its
keys of summary.json and its notes of what it left out."""

from __future__ import annotations

from quantload.experiments.base import ExperimentReport
from quantload.experiments.context.chapter import CHAPTER
from quantload.experiments.context.findings import (
    GAP_SECTION,
    ContextFindings,
    context_findings,
    policy_gaps,
    summary_keys,
)

REPORT = ExperimentReport[ContextFindings](
    findings=context_findings,
    chapter=CHAPTER,
    summary=summary_keys,
    subject="conversations beyond the slot context",
    gap_section=GAP_SECTION,
    gaps=lambda given, found: policy_gaps(given),
)
