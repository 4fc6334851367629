"""What the report computes of the prompt-cache experiment (its `Analysis.findings` entry), what it
adds to summary.json, and its note of each model file it did not measure."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quantload.analysis.report_input import ReportInput, not_run_because
from quantload.analysis.run_data import Gap
from quantload.experiments.prefix_cache import EXPERIMENT
from quantload.experiments.prefix_cache.stages import NAME
from quantload.experiments.prefix_cache.tables import CacheComparison, prompt_cache_table
from quantload.rundir import RECORDS_JSONL

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis

GAP_SECTION = "prompt_cache"


@dataclass(frozen=True)
class PrefixCacheFindings:
    """One comparison of cache_prompt off against on per quantization that ran it."""

    comparisons: tuple[CacheComparison, ...]  # tables.prompt_cache_table


def prefix_cache_findings(given: ReportInput) -> PrefixCacheFindings:
    """The comparisons of the run's prompt-cache stages (none where it has none)."""
    return PrefixCacheFindings(tuple(prompt_cache_table(given.stages, given.quants)))


def findings_of(analysis: Analysis) -> PrefixCacheFindings:
    """The prompt-cache experiment's findings in `analysis` (empty ones where it holds none)."""
    found = analysis.findings.get(NAME)
    return found if isinstance(found, PrefixCacheFindings) else PrefixCacheFindings(())


def summary_keys(found: PrefixCacheFindings) -> Mapping[str, Any]:
    """Its key of summary.json, named as before the experiment had a folder of its own:
    `prompt_cache`, one CacheComparison per quantization; the report makes it JSON-safe."""
    return {"prompt_cache": [item.to_dict() for item in found.comparisons]}


def speedup_p50(found: PrefixCacheFindings, quant: str) -> float | None:
    """TTFT p50 off / on of `quant` (None where it was not measured): `quantload compare`'s figure."""
    chosen = [c.speedup_p50 for c in found.comparisons if c.quant == quant]
    return chosen[0] if chosen else None


def file_gaps(given: ReportInput, quant: str) -> list[Gap]:
    """`quant` has no prompt-cache stage in a run with records: the experiment on it, not measured."""
    run, stages = given.run, given.stages
    if run.records.empty:
        return []
    mine = stages[stages["quant"] == quant] if not stages.empty else stages
    if not mine.empty and (mine["experiment"] == NAME).any():
        return []
    why = not_run_because(run, EXPERIMENT, quant, RECORDS_JSONL)
    return [Gap(GAP_SECTION, f"prompt-cache experiment on {quant}", why)]
