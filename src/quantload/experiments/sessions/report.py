"""The sessions experiment's part of the report (ExperimentReport): its findings, its chapter and
its keys of summary.json. Its chapter comes right before the traffic chapter, where its section
was before it had a folder of its own; it files no "not measured" note of its own (its section
says when it did not run)."""

from __future__ import annotations

from quantload.experiments.base import ExperimentReport
from quantload.experiments.sessions.chapter import CHAPTER
from quantload.experiments.sessions.findings import SessionsFindings, sessions_findings, summary_keys

REPORT = ExperimentReport[SessionsFindings](
    findings=sessions_findings,
    chapter=CHAPTER,
    summary=summary_keys,
    follows="plan",
)
