"""The prompt-cache experiment's part of the report (ExperimentReport): its findings, its chapter
(the ttft chapter's last section, so it follows that chapter), its key of summary.json, its note
of each model file it did not measure, filed among that file's own notes, and its figure of
`quantload compare` (the TTFT p50 speed-up)."""

from __future__ import annotations

from quantload.analysis import fmt
from quantload.experiments.base import ComparedFigure, ExperimentReport
from quantload.experiments.prefix_cache.chapter import CHAPTER
from quantload.experiments.prefix_cache.findings import (
    GAP_SECTION,
    PrefixCacheFindings,
    file_gaps,
    prefix_cache_findings,
    speedup_p50,
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
    compared=(
        ComparedFigure(
            "prompt-cache TTFT p50 speed-up", speedup_p50, lambda v: f"{v:.2f}×" if v else fmt.DASH, False
        ),
    ),
)
