"""The batching experiment's part of the report (ExperimentReport): its findings, its section of the
server flags chapter and its key of summary.json's `server_flags`."""

from __future__ import annotations

from quantload.experiments.base import ExperimentReport
from quantload.experiments.batching.chapter import CHAPTER
from quantload.experiments.batching.findings import BatchingFindings, batching_findings, summary_keys

REPORT = ExperimentReport[BatchingFindings](
    findings=batching_findings,
    chapter=CHAPTER,
    summary=summary_keys,
    within="server_flags",
)
