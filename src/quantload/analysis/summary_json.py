"""summary.json (schema `quantload.report/1`): the report's figures for machines to read, as one
typed model.

The verdicts, the header and the KV rows keep the types the analysis
computes them as; a table is a list of its rows (`Row`), whose columns are those of the frame the
named analysis module builds. Missing figures are null, never NaN. An experiment with a part of its
own in the report (experiments.base.ExperimentReport) adds its keys through that part's `summary`:
at the top level, or under `server_flags` for one placed within that chapter (one placed within
traffic, which has no key of its own, at the top level).
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, ConfigDict, Field

from quantload import json_input
from quantload.analysis.analyze import Analysis
from quantload.analysis.capacity import CapacityVerdict, slo_text
from quantload.analysis.imatrix_pairs import imatrix_pair_table
from quantload.analysis.prediction_check import prediction_checks
from quantload.analysis.quality_verdict import QualityVerdict
from quantload.analysis.run_data import Gap
from quantload.analysis.run_tables import Header, KvRow
from quantload.analysis.stats import PERCENTILE_METHOD_TEXT
from quantload.experiments.registry import reported
from quantload.load.limit_file import LimitLine
from quantload.stats import PERCENTILE_METHOD

SUMMARY_SCHEMA = "quantload.report/1"
SERVER_FLAGS = "server_flags"  # the chapter (and key) the flag experiments' parts are placed within
Row = dict[str, Any]


class _SummaryPart(BaseModel):
    model_config = ConfigDict(extra="forbid", populate_by_name=True)


class SloSummary(_SummaryPart):
    """The SLO the verdicts were judged against, and in words."""

    ttft_s: float
    ttft_percentile: str
    tpot_s: float
    tpot_percentile: str
    max_failed_frac: float
    confidence: float
    burst_requests: int
    text: str


class PercentileMethod(_SummaryPart):
    numpy_method: str
    text: str


class ClientSummary(_SummaryPart):
    """The load generator's health: one sentence and the stages it lagged in (stage_tables)."""

    sentence: str
    lagging_stages: list[Row]


class PrometheusSummary(_SummaryPart):
    """Where the server-side figures came from (null: no Prometheus) and the histogram check."""

    origin: str | None
    histogram_check: list[Row]  # prometheus_tables.histogram_check
    series_points: int
    gpu_energy: list[Row] = []  # gpu_energy.gpu_energy_table: joules per output token and request


class PlanSummary(_SummaryPart):
    """The capacity plan (capacity_plan.CapacityPlan.to_dict) and the scale-out signals
    (scale_out.SignalVerdict.to_dict), one entry per quantization each."""

    inputs: dict[str, Any]
    quants: list[Row]
    missing: list[str]
    fewest_servers: str | None
    context: dict[str, Any] | None = None  # capacity_plan.ContextNeed: the context a slot needs
    scale_out: list[Row]


class QualityLossSummary(_SummaryPart):
    """Quality loss against F16 (quality_loss.QualityLoss): what it is measured against, a sentence
    per quantization, and every KLD row (one per quantization and KV-cache type)."""

    reference: str | None
    floor_kld_mean_nats: float | None
    sentences: list[str]
    missing: str | None
    rows: list[Row]  # quality_loss.QUALITY_LOSS_COLUMNS


class TunePart(_SummaryPart):
    """The tune: every trial (tune_tables.TRIAL_COLUMNS), each quantization's outcome (tune.json)
    and the verdict."""

    trials: list[Row]
    outcomes: dict[str, Any]
    verdict: str


class ServerFlagsSummary(_SummaryPart):
    """The server flags chapter: the tune, and the keys the flag experiments' report parts add
    (kept as they are read: batching, slots, speculation, each its table's rows and its verdict)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    tune: TunePart


class ReportFiles(_SummaryPart):
    """The report's files, relative to its folder."""

    md: str
    html: str
    csv: str
    plots: list[str]


class SummaryFile(_SummaryPart):
    """The whole summary.json: the keys below, and those the experiments' own report parts add
    (kept as they are read: each part's `summary` names them)."""

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    schema_: str = Field(default=SUMMARY_SCHEMA, alias="schema")
    run_id: str
    header: Header
    slo: SloSummary
    percentile_method: PercentileMethod
    quants: list[str]
    capacity: list[CapacityVerdict]
    quality_verdict: QualityVerdict  # the capacity verdict at report.max_kld_mean_nats
    plan: PlanSummary
    table: list[Row]  # run_tables.quant_table, as table.csv
    sweep_levels: list[Row]  # stage_tables.level_table of the sweep
    stages: list[Row]  # stage_tables.stage_table
    ttft_split: list[Row]  # ttft_tables.ttft_split_table
    kv: list[KvRow]
    quality_loss: QualityLossSummary
    imatrix_pairs: list[Row] = Field(default_factory=list)  # imatrix_pairs.imatrix_pair_table
    sensitivity: dict[str, Any] | None = None  # sensitivity.json, when the run scanned
    roofline: list[Row]  # run_tables.roofline_frame
    littles_law: list[Row]  # littles_law.littles_law_table
    limits: list[LimitLine]  # limits.jsonl, as the report read it
    prediction: list[Row] = Field(default_factory=list)  # prediction_check.PredictionCheck per file
    reasoning: list[Row]  # ttft_tables.reasoning_table
    server_flags: ServerFlagsSummary
    client: ClientSummary
    prometheus: PrometheusSummary
    not_measured: list[Gap]
    notes: list[str]
    files: ReportFiles

    def to_json_text(self) -> str:
        """The file's text: indented JSON."""
        return json.dumps(self.model_dump(mode="python", by_alias=True), indent=2) + "\n"


def clean(value: Any) -> Any:
    """JSON-safe: NaN and infinities become None, numpy scalars plain numbers, tuples lists."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, str | bytes):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is pd.NA or value is pd.NaT:
        return None
    return value


def _rows(frame: pd.DataFrame) -> list[Row]:
    return [clean(row) for row in frame.to_dict("records")] if not frame.empty else []


def _server_flags(analysis: Analysis) -> dict[str, Any]:
    return {
        **_experiment_keys(analysis, SERVER_FLAGS),
        "tune": {
            "trials": _rows(analysis.tune.trials),
            "outcomes": analysis.tune.outcomes,
            "verdict": analysis.tune_verdict,
        },
    }


def _experiment_keys(analysis: Analysis, within: str | None = None) -> dict[str, Any]:
    """The keys the experiments' own report parts add, from their findings: those of the parts
    placed `within` server_flags (its key of summary.json), else every other's (a chapter of
    their own, or one without a key of its own: traffic)."""
    keys: dict[str, Any] = {}
    for experiment, part in reported():
        if (part.within == SERVER_FLAGS) == (within == SERVER_FLAGS):
            keys.update(part.summary(analysis.findings[experiment.name]))
    return keys


def summary_file(analysis: Analysis, files: ReportFiles) -> SummaryFile:
    """Everything the report shows, as one object."""
    data: dict[str, Any] = clean(
        {
            "schema": SUMMARY_SCHEMA,
            "run_id": analysis.header.run_id,
            "header": analysis.header.to_dict(),
            "slo": {**dataclasses.asdict(analysis.slo), "text": slo_text(analysis.slo)},
            "percentile_method": {"numpy_method": PERCENTILE_METHOD, "text": PERCENTILE_METHOD_TEXT},
            "quants": list(analysis.quants),
            "capacity": [verdict.to_dict() for verdict in analysis.capacity],
            "quality_verdict": analysis.quality_verdict.to_dict(),
            "plan": {
                **analysis.plan.to_dict(),
                "scale_out": [verdict.to_dict() for verdict in analysis.scale_out],
            },
            "table": _rows(analysis.quant_table),
            "sweep_levels": _rows(analysis.levels),
            "stages": _rows(analysis.stages),
            "ttft_split": _rows(analysis.ttft_split),
            "kv": [row.to_dict() for row in analysis.kv],
            "quality_loss": {**analysis.quality_loss.to_dict(), "rows": _rows(analysis.quality_loss.rows)},
            "imatrix_pairs": _rows(imatrix_pair_table(analysis.run, analysis.quants)),
            "sensitivity": analysis.run.sensitivity.to_json() if analysis.run.sensitivity else None,
            "roofline": _rows(analysis.roofline),
            "littles_law": _rows(analysis.littles_law),
            "limits": [line.model_dump(mode="json", by_alias=True) for line in analysis.limits],
            "prediction": [
                check.to_dict()
                for check in prediction_checks(
                    analysis.run, analysis.levels, analysis.capacity, analysis.quants, analysis.slo
                )
            ],
            "reasoning": _rows(analysis.reasoning),
            "server_flags": _server_flags(analysis),
            **_experiment_keys(analysis),
            "client": {"sentence": analysis.client_sentence, "lagging_stages": _rows(analysis.lagging)},
            "prometheus": {
                "origin": analysis.prometheus_origin or None,
                "histogram_check": _rows(analysis.histogram_check),
                "series_points": len(analysis.server_series),
                "gpu_energy": _rows(analysis.gpu_energy),
            },
            "not_measured": [gap.to_dict() for gap in analysis.gaps],
            "notes": list(analysis.notes),
            "files": files.model_dump(),
        }
    )
    return SummaryFile.model_validate(data)


def load_summary_file(path: Path) -> SummaryFile:
    """Read a summary.json written by this version; ValueError when it is not one."""
    return SummaryFile.model_validate(json_input.loads(path.read_bytes()))
