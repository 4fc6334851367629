"""What the report computes of the soak (its `Analysis.findings` entry): every soak of the run,
what it could not measure of them and what reading soak.jsonl left out; and its key of
summary.json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from quantload.analysis import fmt
from quantload.analysis.report_input import ReportInput
from quantload.analysis.run_data import Gap
from quantload.experiments.registry import requested_names
from quantload.experiments.soak import EXPERIMENT
from quantload.experiments.soak.stages import NAME
from quantload.experiments.soak.tables import DRIFT_TTFT, PART_ALL, SoakRun, read_lines, soak_runs
from quantload.rundir import SOAK_JSONL

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


@dataclass(frozen=True)
class SoakFindings:
    """Every soak of the run, and what the report must say it could not measure (its gaps, filed
    under the "soak" section) or could not read (its notes)."""

    runs: tuple[SoakRun, ...] = ()
    gaps: tuple[Gap, ...] = ()
    notes: tuple[str, ...] = ()


def soak_findings(given: ReportInput) -> SoakFindings:
    """Every soak of the run (tables.soak_runs), with its gaps: per soak what it could not read or
    fit, and the soak itself where the settings asked for one and the run has none."""
    run = given.run
    lines, bad = read_lines(run)
    notes = tuple(note for note in (bad.note(),) if note is not None)
    settings = run.settings
    settle = settings.soak.settle_slices if settings is not None else 1
    runs = soak_runs(lines, given.stages, given.slo, settle)
    gaps = [gap for soak_run in runs for gap in run_gaps(soak_run)]
    asked = settings is not None and EXPERIMENT.missing(settings) is None
    if settings is not None and asked and not runs and not run.records.empty:
        why = run.step_why(EXPERIMENT.step, None, SOAK_JSONL)
        if NAME not in requested_names(settings):
            why = f"not asked for (load.experiments leaves {NAME} out)"
        gaps.append(Gap("soak", "the soak", why))
    return SoakFindings(runs, tuple(gaps), notes)


def run_gaps(run: SoakRun) -> list[Gap]:
    """What one soak could not measure: its slices, either memory, the KV cells, a drift to fit."""
    label = f"during the soak of {run.quant or run.server}"
    gaps = []
    if run.slices.empty:
        gaps.append(Gap("soak", f"every slice {label}", "no slice of it ended (the run stopped first?)"))
        return gaps
    if run.samples["server_rss_bytes"].dropna().empty:
        why = run.memory_missing or "; ".join(e for e in run.reading_errors if e.startswith("memory")) or (
            f"{SOAK_JSONL} holds no reading of it"
        )
        gaps.append(Gap("soak", f"server memory {label}", why))
    if run.slices["client_rss_bytes"].dropna().empty:
        why = "its stage lines carry no client_rss_bytes (no /proc?)"
        gaps.append(Gap("soak", f"load client memory {label}", why))
    if run.samples["kv_cells_used"].dropna().empty:
        slots = [e for e in run.reading_errors if e.startswith("/slots")]
        why = "; ".join(slots) or f"{SOAK_JSONL} has no reading"
        gaps.append(Gap("soak", f"KV cells in use {label}", why))
    for drift in run.drifts:
        unmeasured = drift.what != DRIFT_TTFT and drift.points == 0  # its own gap says why
        if drift.part == PART_ALL and drift.beyond_noise is None and not unmeasured:
            gaps.append(
                Gap(
                    "soak",
                    f"drift of {drift.what} {label}",
                    f"{fmt.counted(drift.points, 'slice')} to fit after the first {run.settle_slices};"
                    " it takes 3",
                    "run longer, or with shorter soak.slice_s",
                )
            )
    return gaps


def findings_of(analysis: Analysis) -> SoakFindings:
    """The soak's findings in `analysis` (empty ones where it holds none)."""
    found = analysis.findings.get(NAME)
    if isinstance(found, SoakFindings):
        return found
    return SoakFindings()


class SoakSummary(BaseModel):
    """One soak in summary.json (SoakRun.to_dict): the level held and for how long, the drift per
    hour of TTFT p99 and of the server's and the load client's memory (drift.Drift.to_dict), every
    slice."""

    model_config = ConfigDict(extra="forbid")

    server: str
    quant: str
    invocation: str
    level: str
    level_from: str
    duration_s: float | None
    held_s: float | None
    drain_frac: float | None
    slice_s: float | None
    slices_planned: int | None
    settle_slices: int
    memory_source: str | None
    memory_missing: str | None
    reading_errors: list[str]
    drift: list[dict[str, Any]]
    slices: list[dict[str, Any]]  # tables.SLICE_COLUMNS


def summary_keys(found: SoakFindings) -> Mapping[str, Any]:
    """Its key of summary.json, named as before the experiment had a folder of its own: `soak`,
    one SoakSummary per soak; the report makes it JSON-safe."""
    return {"soak": [SoakSummary.model_validate(run.to_dict()).model_dump() for run in found.runs]}
