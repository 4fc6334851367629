"""From a loaded run (and a Prometheus connection, when there is one) to every figure of the report:
the one place that calls each computation and holds its result for the chapters to show. An
experiment with a part of its own in the report (experiments.base.ExperimentReport) computes its
findings here too, asked through the registry: `Analysis.findings` holds them by its name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import pandas as pd

from quantload.analysis.capacity import CapacityVerdict, capacity
from quantload.analysis.capacity_plan import CapacityPlan, plan_from_run, plan_view
from quantload.analysis.context_tables import conversation_table, policy_table
from quantload.analysis.context_tables import turn_table as context_turn_table
from quantload.analysis.gpu_energy import WHAT as GPU_ENERGY_WHAT
from quantload.analysis.gpu_energy import gpu_energy_table, read_gpu_file
from quantload.analysis.kv_types import kv_type_table
from quantload.analysis.littles_law import littles_law_table, stage_windows
from quantload.analysis.mixed_tables import mixed_table, mixed_verdict
from quantload.analysis.prometheus_source import PromConnection, TimeWindow, open_prometheus
from quantload.analysis.prometheus_tables import (
    histogram_check,
    series_step_s,
    server_in_flight,
    server_series,
)
from quantload.analysis.quality_loss import QualityLoss, quality_loss
from quantload.analysis.quality_verdict import QualityVerdict, quality_verdict
from quantload.analysis.report_input import ReportInput
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
from quantload.analysis.session_tables import hit_summary, session_hits, turn_table
from quantload.analysis.soak import SoakRun, soak_view
from quantload.analysis.stage_tables import client_verdict, lagging_stages, level_table, stage_table
from quantload.analysis.ttft_tables import (
    CacheComparison,
    prompt_cache_table,
    reasoning_table,
    ttft_split_table,
)
from quantload.analysis.tune_tables import TuneTables, tune_tables, tune_verdict
from quantload.config import PlanSettings, ReportSettings, SloSettings
from quantload.experiments import context_overflow, kv_types, prefix_cache, sessions
from quantload.experiments.base import Experiment
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
    open_loop: pd.DataFrame
    quant_table: pd.DataFrame
    capacity: tuple[CapacityVerdict, ...]
    ttft_split: pd.DataFrame
    prompt_cache: tuple[CacheComparison, ...]
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
    kv_types: pd.DataFrame  # kv_types.kv_type_table
    session_turns: pd.DataFrame  # session_tables.turn_table
    session_hits: pd.DataFrame  # session_tables.session_hits
    session_hit_summary: pd.DataFrame  # session_tables.hit_summary
    mixed: pd.DataFrame  # mixed_tables.mixed_table
    mixed_verdict: str
    limits: tuple[LimitLine, ...]  # the searches of each server as the run configured it
    reasoning: pd.DataFrame  # ttft_tables.reasoning_table
    tune: TuneTables  # tune_tables.tune_tables: the tune's trials and outcomes (its section of the
    # server flags chapter; the flag experiments' own sections are theirs: `findings`)
    tune_verdict: str
    gpu_energy: pd.DataFrame  # gpu_energy.gpu_energy_table
    context_turns: pd.DataFrame  # context_tables.turn_table
    context_conversations: pd.DataFrame  # context_tables.conversation_table
    context_policies: pd.DataFrame  # context_tables.policy_table
    findings: Mapping[str, object]  # by experiment name: its ExperimentReport.findings
    soak: tuple[SoakRun, ...] = ()  # soak.soak_view: every soak of the run


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
    run: RunData, quants: tuple[str, ...], stages: pd.DataFrame, levels: pd.DataFrame
) -> list[Gap]:
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
        has_prefix = not mine.empty and (mine["experiment"] == prefix_cache.NAME).any()
        if not run.records.empty and not has_prefix:
            why = not_run_because(run, prefix_cache.EXPERIMENT, quant, RECORDS_JSONL)
            gaps.append(Gap("prompt_cache", f"prompt-cache experiment on {quant}", why))
    gaps += _kld_gaps(run, quants) + _kv_type_gaps(run, quants, stages)
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


def not_run_because(run: RunData, experiment: Experiment, quant: str | None, what_file: str) -> str:
    """Why an experiment has no stages: its input missing (the registry's reason), left out of
    load.experiments, or what run.json says of its step."""
    settings = run.settings
    if settings is not None:
        why = experiment.missing(settings)
        if why is not None:
            return f"not run because {why}"
        if experiment.name not in requested_names(settings):
            return f"not asked for (load.experiments leaves {experiment.name} out)"
    return run.step_why(experiment.step, quant, what_file)


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


def _kv_type_gaps(run: RunData, quants: tuple[str, ...], stages: pd.DataFrame) -> list[Gap]:
    """The KV-cache types the run meant to serve per quantization (kv_types) without a stage."""
    settings = run.settings
    if settings is None or run.records.empty or kv_types.EXPERIMENT.missing(settings) is not None:
        return []
    types = settings.quality.kld_cache_types
    ran = stages[stages["experiment"] == kv_types.NAME] if not stages.empty else stages
    seen = {(str(r["quant"]), str(r["kv_cache_type"])) for r in ran.to_dict("records")}
    users = settings.kv_types.users
    return [
        Gap(
            "kv_types",
            f"decode at {users} users of {quant} with a {kind} KV cache",
            not_run_because(run, kv_types.EXPERIMENT, quant, STAGES_JSONL),
        )
        for quant in quants
        for kind in types
        if (quant, kind) not in seen and not run.records[run.records["quant"] == quant].empty
    ]


def _not_run_gaps(run: RunData, stages: pd.DataFrame, parts: ReportParts) -> list[Gap]:
    """The context experiment and those with a part of their own in the report, where the run
    meant to measure them and has no stage of them."""
    if run.records.empty:
        return []
    ran = set(stages["experiment"]) if not stages.empty else set()
    asked = set(requested_names(run.settings)) if run.settings is not None else None
    gaps = []
    for experiment, section, what in (
        (context_overflow.EXPERIMENT, "contexts", "conversations beyond the slot context"),
        *(
            (experiment, part.gap_section, part.subject)
            for experiment, part in parts
            if part.gap_section is not None and part.subject is not None
        ),
    ):
        # a gap is what the run meant to measure: an experiment load.experiments leaves out is none,
        # nor one in a folder whose settings are unknown (a compose or multi-host run), as for the
        # other experiments
        if experiment.name not in ran and asked is not None and experiment.name in asked:
            gaps.append(Gap(section, what, not_run_because(run, experiment, None, STAGES_JSONL)))
    return gaps


def _context_gaps(run: RunData, stages: pd.DataFrame, plan: CapacityPlan) -> list[Gap]:
    """The context policies the context experiment left out, and the context a slot needs where it
    could not be sized."""
    if run.records.empty:
        return []
    ran = set(stages["experiment"]) if not stages.empty else set()
    asked = set(requested_names(run.settings)) if run.settings is not None else None
    gaps = []
    settings = run.settings
    if context_overflow.NAME in ran and settings is not None:
        measured = set(stages.loc[stages["experiment"] == context_overflow.NAME, "context_policy"].dropna())
        for policy in settings.context.policies:
            if policy not in measured:
                why = (
                    "the server was not started by quantload, so it could not run with --context-shift"
                    if policy == "shift"
                    else run.step_why(context_overflow.EXPERIMENT.step, None, STAGES_JSONL)
                )
                gaps.append(Gap("contexts", f"the {policy} policy", why, "run it through `quantload run`"))
    conversations_asked = asked is not None and bool(asked & {sessions.NAME, context_overflow.NAME})
    if plan.context is not None and plan.context.why_not is not None and conversations_asked:
        how = "run the sessions or context experiment"
        gaps.append(Gap("plan", "the context a slot needs", plan.context.why_not, how))
    return gaps


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
    soaks = soak_view(run, stages, slo)
    gaps = list(run.gaps) + _quant_gaps(run, quants, stages, levels) + soaks.gaps
    notes = list(run.reading_notes) + _excluded_notes(levels) + _stage_warnings(run.stages) + soaks.notes
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
    verdicts = tuple(capacity(levels, quants, slo, run.limits, stages))
    plan_inputs = plan_settings or PlanSettings()
    plan = plan_from_run(run, verdicts, plan_view(**plan_inputs.model_dump()), slo.ttft_s, slo.tpot_s, stages)
    parts = reported()
    gaps += _not_run_gaps(run, stages, parts) + _context_gaps(run, stages, plan)
    bad_variants = BadLines(VARIANTS_JSONL)
    variants = tuple(read_variants(run.run_dir, bad_variants))
    given = ReportInput(run, stages, slo, quants, plan, variants)
    conversations = conversation_table(run.records, stages)
    tune = tune_tables(run.run_dir)
    variants_note = bad_variants.note()
    kld = run.quality.kld if run.quality is not None else None
    served = run.settings.server if run.settings is not None else None
    mixed = mixed_table(run.records, stages, run.itl_by_request or {}, quants)
    hits = session_hits(run.records, stages, quants)
    return Analysis(
        run=run,
        report=report,
        slo=slo,
        quants=quants,
        header=build_header(run, stages),
        stages=stages,
        levels=levels,
        open_loop=level_table(stages, "open_loop", "rate_rps", quants, run.records, slo),
        quant_table=quant_table(run, levels, quants),
        capacity=verdicts,
        ttft_split=ttft_split_table(run.records, stages, "sweep", quants),
        prompt_cache=tuple(prompt_cache_table(stages, quants)),
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
        kv_types=kv_type_table(run, stages, quants),
        session_turns=turn_table(run.records, stages, quants),
        session_hits=hits,
        session_hit_summary=hit_summary(hits),
        mixed=mixed,
        mixed_verdict=mixed_verdict(mixed),
        limits=tuple(line for line in run.limits if line.variant is None),  # variants: their own chapters
        reasoning=reasoning_table(run.records, quants),
        tune=tune,
        tune_verdict=tune_verdict(tune),
        gpu_energy=energy,
        context_turns=context_turn_table(run.records, stages, quants),
        context_conversations=conversations,
        context_policies=policy_table(conversations, quants),
        findings={experiment.name: part.findings(given) for experiment, part in parts},
        soak=soaks.runs,
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
