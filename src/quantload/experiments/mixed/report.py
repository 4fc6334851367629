"""The mixed experiment's part of the report (ExperimentReport): its findings, its chapter and its
keys of summary.json. Its chapter comes right before the traffic chapter (after the sessions one,
in the registry's order), where its section was before it had a folder of its own; it files no
"not measured" note of its own (its section says when it did not run). The report keeps every
inter-token gap of its records: its ITL percentiles pool them."""

from __future__ import annotations

from quantload.experiments.base import ExperimentReport
from quantload.experiments.mixed.chapter import CHAPTER
from quantload.experiments.mixed.findings import MixedFindings, mixed_findings, summary_keys

REPORT = ExperimentReport[MixedFindings](
    findings=mixed_findings,
    chapter=CHAPTER,
    summary=summary_keys,
    follows="plan",
    itl_gaps=True,
)
