"""The open loop's part of the report (ExperimentReport): its findings, its chapter (the load
chapter's last section, so it follows that chapter) and its key of summary.json. It has no "not
measured" note: a run without rates says so in its section."""

from __future__ import annotations

from quantload.experiments.base import ExperimentReport
from quantload.experiments.open_loop.chapter import CHAPTER
from quantload.experiments.open_loop.findings import OpenLoopFindings, open_loop_findings, summary_keys

REPORT = ExperimentReport[OpenLoopFindings](
    findings=open_loop_findings,
    chapter=CHAPTER,
    summary=summary_keys,
    follows="load",
)
