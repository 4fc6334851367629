"""What the report computes of the kv_types experiment (its `Analysis.findings` entry), what it adds
to summary.json, and the cache types a run meant to serve per quantization and has no stage of."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from quantload.analysis.report_input import ReportInput, not_run_because
from quantload.analysis.run_data import Gap
from quantload.experiments.kv_types import EXPERIMENT
from quantload.experiments.kv_types.stages import NAME
from quantload.experiments.kv_types.tables import KV_TYPE_COLUMNS, kv_type_table
from quantload.rundir import STAGES_JSONL

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis

GAP_SECTION = "kv_types"


@dataclass(frozen=True)
class KvTypesFindings:
    """The trade-off table: one row per quantization and KV-cache type."""

    table: pd.DataFrame  # tables.kv_type_table


def kv_types_findings(given: ReportInput) -> KvTypesFindings:
    """The run's KV-cache type trade-off (an empty table where fewer than two types were measured)."""
    return KvTypesFindings(kv_type_table(given.run, given.stages, given.quants))


def findings_of(analysis: Analysis) -> KvTypesFindings:
    """The kv_types experiment's findings in `analysis` (an empty table where it holds none)."""
    found = analysis.findings.get(NAME)
    if isinstance(found, KvTypesFindings):
        return found
    return KvTypesFindings(pd.DataFrame(columns=list(KV_TYPE_COLUMNS)))


def summary_keys(found: KvTypesFindings) -> Mapping[str, Any]:
    """Its key of summary.json, named as before the experiment had a folder of its own:
    `kv_cache_types` (tables.kv_type_table's rows); the report makes them JSON-safe."""
    return {"kv_cache_types": found.table.to_dict("records")}


def cache_type_gaps(given: ReportInput) -> list[Gap]:
    """The KV-cache types the run meant to serve per quantization without a stage."""
    run, stages, settings = given.run, given.stages, given.run.settings
    if settings is None or run.records.empty or EXPERIMENT.missing(settings) is not None:
        return []
    types = settings.quality.kld_cache_types
    ran = stages[stages["experiment"] == NAME] if not stages.empty else stages
    seen = {(str(r["quant"]), str(r["kv_cache_type"])) for r in ran.to_dict("records")}
    users = settings.kv_types.users
    return [
        Gap(
            GAP_SECTION,
            f"decode at {users} users of {quant} with a {kind} KV cache",
            not_run_because(run, EXPERIMENT, quant, STAGES_JSONL),
        )
        for quant in given.quants
        for kind in types
        if (quant, kind) not in seen and not run.records[run.records["quant"] == quant].empty
    ]
