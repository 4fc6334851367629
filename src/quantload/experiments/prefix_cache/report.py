"""The prompt-cache experiment's part of the report (ExperimentReport): its findings, its chapter
(the ttft chapter's last section, so it follows that chapter), its key of summary.json and its note
of each model file it did not measure, filed among that file's own notes."""

from __future__ import annotations

from quantload.experiments.base import ExperimentReport
from quantload.experiments.prefix_cache.chapter import CHAPTER
from quantload.experiments.prefix_cache.findings import (
    GAP_SECTION,
    PrefixCacheFindings,
    file_gaps,
    prefix_cache_findings,
    summary_keys,
)

REPORT = ExperimentReport[PrefixCacheFindings](
    findings=prefix_cache_findings,
    chapter=CHAPTER,
    summary=summary_keys,
    subject=None,
    gap_section=GAP_SECTION,
    follows="ttft",
    file_gaps=file_gaps,
)
