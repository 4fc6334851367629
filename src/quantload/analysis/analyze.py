"""From a loaded run (and a Prometheus connection, when there is one) to every figure of the report:
the one place that calls each computation and holds its result for the chapters to show. An
experiment with a part of its own in the report (experiments.base.ExperimentReport) computes its
findings here too, asked through the registry: `Analysis.findings` holds them by its name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from quantload.analysis.capacity import CapacityVerdict, capacity
from quantload.analysis.capacity_plan import CONVERSATION_EXPERIMENTS, CapacityPlan, plan_from_run, plan_view
from quantload.analysis.gpu_energy import WHAT as GPU_ENERGY_WHAT
from quantload.analysis.gpu_energy import gpu_energy_table, read_gpu_file
from quantload.analysis.littles_law import littles_law_table, stage_windows
from quantload.analysis.prometheus_source import PromConnection, TimeWindow, open_prometheus
from quantload.analysis.prometheus_tables import (
    histogram_check,
    series_step_s,
    server_in_flight,
    server_series,
)
from quantload.analysis.quality_loss import QualityLoss, quality_loss
from quantload.analysis.quality_verdict import QualityVerdict, quality_verdict
from quantload.analysis.report_input import ReportInput, not_run_because
from quantload.analysis.run_data import Gap, RunData
from quantload.analysis.run_tables import (
    Header,
    KvRow,
    build_header,
    kv_rows,
    quant_table,
    roofline_frame,
    users_levels,
)
from quantload.analysis.scale_out import SignalVerdict, scale_out_signals
from quantload.analysis.stage_tables import client_verdict, lagging_stages, level_table, stage_table
from quantload.analysis.ttft_tables import reasoning_table, ttft_split_table
from quantload.analysis.tune_tables import TuneTables, tune_tables, tune_verdict
from quantload.config import PlanSettings, ReportSettings, SloSettings
from quantload.experiments.registry import ReportParts, reported, requested_names
from quantload.experiments.variant_file import read_variants
from quantload.load.limit_file import LimitLine
from quantload.observe.promql import PrometheusQueryError
from quantload.quality.kld_results import FLOOR_CACHE_TYPE
from quantload.rundir import KV_JSON, QUALITY_JSON, RECORDS_JSONL, SPEED_JSON, STAGES_JSONL, VARIANTS_JSONL
from quantload.rundir.jsonl import BadLines
from quantload.slo import Slo

WINDOW_MARGIN_S = 5.0


@dataclass(frozen=True)
class Analysis:
    """Every table, verdict and note the renderers show."""

    run: RunData
    report: ReportSettings
    slo: Slo
    quants: tuple[str, ...]
    header: Header
    stages: pd.DataFrame
    levels: pd.DataFrame
    quant_table: pd.DataFrame
    capacity: tuple[CapacityVerdict, ...]
    ttft_split: pd.DataFrame
    kv: tuple[KvRow, ...]
    roofline: pd.DataFrame
    littles_law: pd.DataFrame
    lagging: pd.DataFrame
    client_sentence: str
    server_series: pd.DataFrame
    histogram_check: pd.DataFrame
    prometheus_origin: str
    gaps: tuple[Gap, ...]
    notes: tuple[str, ...]
    plan: CapacityPlan
    scale_out: tuple[SignalVerdict, ...]
    quality_loss: QualityLoss
    quality_verdict: QualityVerdict
    limits: tuple[LimitLine, ...]  # the searches of each server as the run configured it
    reasoning: pd.DataFrame  # ttft_tables.reasoning_table
    tune: TuneTables  # tune_tables.tune_tables: the tune's trials and outcomes (its section of the
    # server flags chapter; the flag experiments' own sections are theirs: `findings`)
    tune_verdict: str
    gpu_energy: pd.DataFrame  # gpu_energy.gpu_energy_table
    findings: Mapping[str, object]  # by experiment name: its ExperimentReport.findings


def load_window(stages: pd.DataFrame) -> TimeWindow | None:
    """From a little before the first stage to a little after the last one."""
    if stages.empty:
        return None
    starts = pd.concat([stages["started_unix_s"], stages["first_sent_unix_s"]]).dropna()
    ends = pd.concat([stages["ended_unix_s"], stages["last_end_unix_s"]]).dropna()
    if starts.empty or ends.empty:
        return None
    return TimeWindow(float(starts.min()) - WINDOW_MARGIN_S, float(ends.max()) + WINDOW_MARGIN_S)


def _quant_gaps(
    run: RunData, quants: tuple[str, ...], stages: pd.DataFrame, levels: pd.DataFrame, given: ReportInput,
    parts: ReportParts,
) -> list[Gap]:
    """What of each model file the run meant to measure and did not, the experiments' notes of one
    model file each (ExperimentReport.file_gaps, file by file; ExperimentReport.quant_gaps) among
    them."""
    gaps = []
    for quant in quants:
        if run.quality is not None and quant not in run.quality.results:
            gaps.append(
                Gap("quality", f"perplexity of {quant}", run.step_why("quality", quant, QUALITY_JSON))
            )
        if run.speed is not None and quant not in run.speed.results:
            gaps.append(
                Gap("speed", f"llama-bench speed of {quant}", run.step_why("speed", quant, SPEED_JSON))
            )
        if run.kv is not None and quant not in run.kv_results:
            gaps.append(Gap("kv", f"KV check of {quant}", run.step_why("kv", quant, KV_JSON)))
        mine = stages[stages["quant"] == quant] if not stages.empty else stages
        if not run.records.empty:
            gaps += _sweep_gaps(run, quant, mine, levels)
        gaps += [gap for _, part in parts if part.file_gaps for gap in part.file_gaps(given, quant)]
    gaps += _kld_gaps(run, quants)
    gaps += [gap for _, part in parts if part.quant_gaps is not None for gap in part.quant_gaps(given)]
    for row in kv_rows(run.kv_results, quants):
        if row.error:
            gaps.append(Gap("kv", f"KV size reported by llama-server for {row.quant}", row.error))
    return gaps


def _sweep_gaps(run: RunData, quant: str, mine: pd.DataFrame, levels: pd.DataFrame) -> list[Gap]:
    """The sweep levels of `quant` without a complete repeat, and why."""
    rows = levels[levels["quant"] == quant] if not levels.empty else levels
    complete = rows[rows["repeats_used"] > 0] if not rows.empty else rows
    trouble = run.step_trouble("load", quant)
    if complete.empty:
        sweep = mine[mine["experiment"] == "sweep"] if not mine.empty else mine
        reasons = [
            f"{s.users} user(s), repeat {s.repeat}: {s.status} ({s.reason})" for s in sweep.itertuples()
        ]
        why = "; ".join([*reasons, *([trouble] if trouble else [])])
        return [
            Gap("load", f"concurrency sweep of {quant}", why or run.step_why("load", quant, RECORDS_JSONL))
        ]
    gaps = []
    by_users = {int(r["users"]): r for r in rows.to_dict("records")}
    for users in users_levels(run, levels):
        row = by_users.get(users)
        if row is not None and row["repeats_used"] > 0:
            continue
        reasons = list(row["excluded"]) if row is not None else []
        why = (
            "; ".join([*reasons, *([trouble] if trouble else [])])
            or "no stage at this level in records.jsonl"
        )
        gaps.append(Gap("load", f"concurrency sweep of {quant} at {users} users", why))
    return gaps


def _kld_gaps(run: RunData, quants: tuple[str, ...]) -> list[Gap]:
    """The quantizations without a KL divergence from F16, when the run meant to measure it."""
    if run.quality is None or (run.settings is not None and not run.settings.quality.kld):
        return []
    if run.quality.kld is None:
        why = run.step_why("kld", None, QUALITY_JSON)
        return [Gap("quality", "KL divergence from F16 (quality.json has no kld)", why)]
    measured = run.quality.kld.for_cache_type(FLOOR_CACHE_TYPE)
    return [
        Gap("quality", f"KL divergence of {quant} from F16", run.step_why("kld", quant, QUALITY_JSON))
        for quant in quants
        if quant not in measured and quant in run.quality.results
    ]


def _not_run_gaps(run: RunData, stages: pd.DataFrame, parts: ReportParts) -> list[Gap]:
    """The experiments with a part of their own in the report (and a `subject` to name), where the
    run meant to measure them and has no stage of them."""
    if run.records.empty:
        return []
    ran = set(stages["experiment"]) if not stages.empty else set()
    asked = set(requested_names(run.settings)) if run.settings is not None else None
    gaps = []
    for experiment, section, what in (
        (experiment, part.gap_section, part.subject) for experiment, part in parts if part.subject is not None
    ):
        # a gap is what the run meant to measure: an experiment load.experiments leaves out is none,
        # nor one in a folder whose settings are unknown (a compose or multi-host run), as for the
        # other experiments
        if experiment.name not in ran and asked is not None and experiment.name in asked:
            gaps.append(Gap(section, what, not_run_because(run, experiment, None, STAGES_JSONL)))
    return gaps


def _own_notes(parts: ReportParts, findings: Mapping[str, object]) -> list[str]:
    """What reading the files of the experiments with a part of their own in the report left out."""
    return [note for experiment, part in parts for note in part.notes(findings[experiment.name])]


def _experiment_gaps(given: ReportInput, parts: ReportParts, findings: Mapping[str, object]) -> list[Gap]:
    """The experiments' own notes beyond their "not run" one (ExperimentReport.gaps), in order."""
    return [gap for experiment, part in parts for gap in part.gaps(given, findings[experiment.name])]


def _plan_gaps(run: RunData, plan: CapacityPlan) -> list[Gap]:
    """The context a slot needs, where the run measured conversations and it could not be sized."""
    if run.records.empty:
        return []
    asked = set(requested_names(run.settings)) if run.settings is not None else None
    conversations_asked = asked is not None and bool(asked & set(CONVERSATION_EXPERIMENTS))
    if plan.context is not None and plan.context.why_not is not None and conversations_asked:
        how = "run the sessions or context experiment"
        return [Gap("plan", "the context a slot needs", plan.context.why_not, how)]
    return []


def _excluded_notes(levels: pd.DataFrame) -> list[str]:
    notes = []
    for row in levels.to_dict("records") if not levels.empty else []:
        if row["repeats_used"] == 0:
            continue  # the whole level is a gap instead
        for text in row["excluded"]:
            notes.append(f"{row['quant']} at {row['users']} users, {text}: left out of the medians")
    return notes


def _stage_warnings(stages: pd.DataFrame) -> list[str]:
    """What the load said was wrong with a stage before it started (e.g. more users than requests)."""
    if stages.empty or "warning" not in stages:
        return []
    starts = stages[stages["event"] == "stage_start"] if "event" in stages else stages
    flagged = starts[starts["warning"].notna()]
    return [
        f"{row.quant} {row.experiment} stage {row.stage_id}: {row.warning}" for row in flagged.itertuples()
    ]


def analyze(
    run: RunData,
    report: ReportSettings,
    slo: Slo,
    prometheus: PromConnection,
    scrape_interval_s: float,
    plan_settings: PlanSettings | None = None,
    stages: pd.DataFrame | None = None,
) -> Analysis:
    """Compute every figure; missing inputs become gaps, never errors. `stages` is the run's
    stage table when the caller has built it already."""
    quants = tuple(run.quants())
    stages = stage_table(run, slo) if stages is None else stages
    levels = level_table(stages, "sweep", "users", quants, run.records, slo)
    verdicts = tuple(capacity(levels, quants, slo, run.limits, stages))
    plan_inputs = plan_settings or PlanSettings()
    plan = plan_from_run(run, verdicts, plan_view(**plan_inputs.model_dump()), slo.ttft_s, slo.tpot_s, stages)
    parts = reported()
    bad_variants = BadLines(VARIANTS_JSONL)
    variants = tuple(read_variants(run.run_dir, bad_variants))
    variants_note = bad_variants.note()
    given = ReportInput(run, stages, slo, quants, plan, variants)
    findings = {experiment.name: part.findings(given) for experiment, part in parts}
    gaps = list(run.gaps) + _quant_gaps(run, quants, stages, levels, given, parts)
    notes = list(run.reading_notes) + _excluded_notes(levels) + _stage_warnings(run.stages)
    notes += _own_notes(parts, findings)
    if run.stages.empty and not run.records.empty:
        notes.append(
            "stages.jsonl is absent: whether each stage completed is unknown, so every stage's records"
            " are used as they are"
        )
    windows = stage_windows(run.records, stages)
    series = pd.DataFrame(columns=["metric", "quant", "unix_s", "value"])
    hist = pd.DataFrame()
    energy = pd.DataFrame()
    server = {}
    window = load_window(stages)
    client = prometheus.client
    if client is not None and window is not None:
        try:
            series = server_series(client, window, series_step_s(window, scrape_interval_s))
            quant_of = {str(s.stage_id): str(s.quant) for s in stages.itertuples()}
            server = server_in_flight(client, windows, quant_of)
            hist = histogram_check(client, stages, run.records, scrape_interval_s)
            energy, energy_gaps = gpu_energy_table(client, run.records, quants, read_gpu_file(run.run_dir))
            gaps += energy_gaps
        except PrometheusQueryError as error:
            notes.append(f"Prometheus stopped answering while the report read it: {error.problem}")
        if series.empty:
            gaps.append(
                Gap("prometheus", "server time series", f"{prometheus.origin} has no exporter series")
            )
    elif not stages.empty:
        for what in (
            "server time series (busy slots, KV use, requests processing and deferred)",
            "Little's law, server side (requests_processing)",
            "Prometheus histogram cross-check of the percentiles",
            GPU_ENERGY_WHAT,
        ):
            gaps.append(prometheus.gap(what))
    lagging = lagging_stages(stages, report.client_lag_threshold_s)
    gaps += _not_run_gaps(run, stages, parts) + _experiment_gaps(given, parts, findings)
    gaps += _plan_gaps(run, plan)
    tune = tune_tables(run.run_dir)
    kld = run.quality.kld if run.quality is not None else None
    served = run.settings.server if run.settings is not None else None
    return Analysis(
        run=run,
        report=report,
        slo=slo,
        quants=quants,
        header=build_header(run, stages),
        stages=stages,
        levels=levels,
        quant_table=quant_table(run, levels, quants),
        capacity=verdicts,
        ttft_split=ttft_split_table(run.records, stages, "sweep", quants),
        kv=tuple(kv_rows(run.kv_results, quants)),
        roofline=roofline_frame(run.speed, quants),
        littles_law=littles_law_table(run.records, stages, windows, server),
        lagging=lagging,
        client_sentence=client_verdict(stages, lagging, report.client_lag_threshold_s),
        server_series=series,
        histogram_check=hist,
        prometheus_origin=prometheus.origin if client is not None else "",
        gaps=tuple(gaps),
        notes=(*notes, *((variants_note,) if variants_note else ()), *tune.notes),
        plan=plan,
        scale_out=scale_out_signals(series, stages, verdicts),
        quality_loss=quality_loss(kld, quants, run.step_why("kld", None, QUALITY_JSON)),
        quality_verdict=quality_verdict(
            verdicts,
            kld,
            report.max_kld_mean_nats,
            served.cache_type_k if served else None,
            served.cache_type_v if served else None,
            slo.confidence,
        ),
        limits=tuple(line for line in run.limits if line.variant is None),  # variants: their own chapters
        reasoning=reasoning_table(run.records, quants),
        tune=tune,
        tune_verdict=tune_verdict(tune),
        gpu_energy=energy,
        findings=findings,
    )


def run_slo(run: RunData, slo: Slo | None) -> Slo:
    """The SLO a run is judged against: `slo` when one is given, else the run's own (its
    config.json), else the defaults."""
    if slo is not None:
        return slo
    if run.settings is not None:
        return Slo.of(run.settings.slo)
    return Slo.of(SloSettings())


def analyze_run(
    run: RunData,
    settings: ReportSettings,
    prometheus_url: str | None = None,
    prometheus_binary: str = "prometheus",
    plan_settings: PlanSettings | None = None,
    slo: Slo | None = None,
) -> Analysis:
    """Every figure of one run, reading Prometheus when one with the run's data can be found;
    judged against `slo` (None: the run's own)."""
    scrape_s = run.settings.observe.scrape_interval_s if run.settings is not None else 1.0
    judged = run_slo(run, slo)
    stages = stage_table(run, judged)
    with open_prometheus(run, prometheus_url, load_window(stages), prometheus_binary) as connection:
        return analyze(run, settings, judged, connection, scrape_s, plan_settings, stages)
