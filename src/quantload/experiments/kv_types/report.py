"""The kv_types experiment's part of the report (ExperimentReport): its findings, its chapter
(closing the model files chapter), its key of summary.json and its notes of the cache types it did
not serve. It has no single "not run" note: its notes name each cache type."""

from __future__ import annotations

from quantload.experiments.base import ExperimentReport
from quantload.experiments.kv_types.chapter import CHAPTER
from quantload.experiments.kv_types.findings import (
    GAP_SECTION,
    KvTypesFindings,
    cache_type_gaps,
    kv_types_findings,
    summary_keys,
)

REPORT = ExperimentReport[KvTypesFindings](
    findings=kv_types_findings,
    chapter=CHAPTER,
    summary=summary_keys,
    subject=None,
    gap_section=GAP_SECTION,
    follows="model_files",
    quant_gaps=cache_type_gaps,
)
