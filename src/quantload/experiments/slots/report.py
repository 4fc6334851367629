"""The slots experiment's part of the report (ExperimentReport): its findings, its section of the
server flags chapter and its key of summary.json's `server_flags`."""

from __future__ import annotations

from quantload.experiments.base import ExperimentReport
from quantload.experiments.slots.chapter import CHAPTER
from quantload.experiments.slots.findings import SlotsFindings, slots_findings, summary_keys

REPORT = ExperimentReport[SlotsFindings](
    findings=slots_findings,
    chapter=CHAPTER,
    summary=summary_keys,
    within="server_flags",
)
