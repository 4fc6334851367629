"""The trace replay's part of the report (ExperimentReport): its findings and its chapter, whose one
section is placed within the traffic chapter, first, before the lengths and reasoning sections. It
adds no key to summary.json and has no "not measured" note: a run without a trace says so in its
section."""

from __future__ import annotations

from quantload.experiments.base import ExperimentReport
from quantload.experiments.trace.chapter import CHAPTER
from quantload.experiments.trace.findings import TraceFindings, summary_keys, trace_findings

REPORT = ExperimentReport[TraceFindings](
    findings=trace_findings,
    chapter=CHAPTER,
    summary=summary_keys,
    within="traffic",
)
