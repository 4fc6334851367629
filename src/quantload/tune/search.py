"""One quantization's tune against its running server: successive halving (quantload.tune.halving)
over the configurations of the space (quantload.tune.space), each trial a limit search on a
variant of the server (`ServerControl`), its state appended to tune.jsonl as it goes.

A trial restarts the server with the configuration's flags, runs the limit search the objective
names (`limit_users` or `limit_rate`, the run's workload and SLO) with its rung's time cap (never
past what is left of the budget), trial size and level seconds, and scores the configuration by
the limit range found (the highest level shown to meet the SLO, the lowest shown to miss it) and
the goodput at that limit (requests/s that met the SLO). A configuration whose server does not
start scores as not run, and the search goes on. Each trial's search is in limits.jsonl under the
variant "tune r<rung> <key>"; each variant's KV cache and memory in variants.jsonl.

With `tune.predict_first` the space is screened before the first trial (quantload.tune.predicted):
halving runs over the configurations kept, the screening goes into tune.jsonl after the start line
(a resume takes it from there rather than measuring costs again), and the outcome carries it.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from quantload.comparison import Comparison, compare_limits
from quantload.config import Settings
from quantload.errors import ConfigError, QuantloadError
from quantload.experiments.base import ExperimentContext
from quantload.experiments.limit_trials import SearchOutcome, fewest_requests, run_limit_search
from quantload.experiments.variant_file import append_variant, memory_mib, variant_line
from quantload.kvcheck import KvCheck
from quantload.load.limit_file import SearchExperiment
from quantload.progress import ProgressCallback
from quantload.text_format import duration
from quantload.tune.halving import PlannedTrial, SuccessiveHalving, plan_rungs
from quantload.tune.predicted import (
    CostMeasure,
    Screening,
    configured_key,
    predict_space,
    screen,
    screen_lines,
    screening_of,
)
from quantload.tune.resume import Resumed, left_out_note, resumable_lines, resume_tune, take_planned
from quantload.tune.space import TuneConfig, configurations, space_key
from quantload.tune.state_file import TuneLine, append_tune_line, rung_dicts
from quantload.tune.trial_trust import server_gone, speculation_after, speculation_before

EXPERIMENT = "tune"


@dataclass(frozen=True)
class TuneOutcome:
    """One quantization's search: its configurations, every trial line, and the winner."""

    quant: str
    server: str
    configs: tuple[TuneConfig, ...]
    search: SuccessiveHalving
    trials: tuple[TuneLine, ...]
    busy_s: float  # the trials' time this invocation (a resumed search: the part it ran)
    baseline: TuneLine | None = None  # the configured flags, searched as the finalists were
    confidence: float = 0.95  # the SLO's: each limit's verdicts, and so the comparisons
    notes: tuple[str, ...] = ()  # what a resume left out of the state (quantload.tune.resume)
    screening: Screening | None = None  # tune.predict_first: what the prediction kept and dropped

    def config(self, key: str) -> TuneConfig:
        return next(config for config in self.configs if config.key == key)

    def against_baseline(self) -> Comparison | None:
        """The best configuration against the configured flags (None: no best, or no baseline)."""
        best, baseline = self.search.winner(), self.baseline
        if best is None or baseline is None or not baseline.ran:
            return None
        return compare_limits(best.limit_range(), baseline.score().limit_range(), self.confidence)

    @property
    def winner(self) -> TuneConfig | None:
        """The configuration to serve with: the best measured, where it beats the configured flags
        by a decided margin (or no baseline was searched); None when the configured flags are as
        good as any tried, or nothing met the SLO."""
        best = self.search.winner()
        if best is None:
            return None
        against = self.against_baseline()
        if against is not None and against.better != "a":
            return None
        return self.config(best.key)

    def trial(self, key: str, rung: int) -> TuneLine | None:
        found = [line for line in self.trials if line.key == key and line.rung == rung]
        return found[-1] if found else None

    @property
    def ending(self) -> str:
        return "done" if self.search.finished else "budget"


def objective_search(settings: Settings) -> SearchExperiment:
    return "limit_users" if settings.tune.objective == "users" else "limit_rate"


def baseline_reserve_s(settings: Settings, final_cap_s: float) -> float:
    """What `tune.budget_s` keeps for the baseline search (none without one): as long as one
    finalist's trial where the budget allows it, else an equal share with the finalists."""
    tune = settings.tune
    if not tune.baseline:
        return 0.0
    return min(final_cap_s, tune.budget_s / (tune.finalists + 1))


def new_search(settings: Settings, keys: Sequence[str]) -> SuccessiveHalving:
    """The successive halving of `keys`, its budget `tune.budget_s` less the baseline's reserve."""
    tune, limit = settings.tune, settings.limit
    rungs = plan_rungs(len(keys), tune.eta, tune.finalists, tune.short_trial_s, limit.time_cap_s)
    reserve = baseline_reserve_s(settings, rungs[-1].time_cap_s)
    return SuccessiveHalving(tuple(keys), rungs, max(tune.budget_s - reserve, 1.0))


def _at_limit(outcome: SearchOutcome) -> tuple[float | None, float | None]:
    """Median goodput and output tok/s of the trials that met the SLO at the limit found."""
    limit = outcome.result.limit
    if limit is None:
        return None, None
    held = {t.stage_id for t in outcome.line.trials if t.met and t.level == limit and t.stage_id}
    chosen = [s for s in outcome.summaries if s.stage_id in held]
    goodput = [s.goodput_rps for s in chosen if s.goodput_rps is not None]
    tokens = [s.output_tok_s for s in chosen if s.output_tok_s is not None]
    return (
        statistics.median(goodput) if goodput else None,
        statistics.median(tokens) if tokens else None,
    )


def _buffers_mib(kv: KvCheck | None) -> float | None:
    if kv is None:
        return None
    found = [mib for kind in ("output", "compute") if (mib := kv.buffer_mib(kind)) is not None]
    return round(sum(found), 2) if found else None


def _trial_settings(settings: Settings, trial: PlannedTrial, left_s: float) -> Settings:
    """The limit search's settings for one trial: its rung's time cap (never past what is left of
    the budget), trial size (closed loop: requests per user and the fewest a level sends; open
    loop: seconds of arrivals; at least two requests a level); a level may spend the seconds [slo]
    gives it on being decided, within the cap."""
    limit, frac = settings.limit, trial.rung.requests_frac
    cap_s = max(1.0, min(trial.rung.time_cap_s, left_s))
    limit = limit.model_copy(
        update={
            "time_cap_s": cap_s,
            "requests_per_user": max(1, round(limit.requests_per_user * frac)),
            "min_requests": max(2, round(fewest_requests(settings) * frac)),
            "trial_seconds": max(2.0, min(limit.trial_seconds * frac, cap_s)),
        }
    )
    # a level keeps the seconds [slo] gives it to be decided (never past the cap): scaled down, a
    # level of a short trial could not reach the requests its percentile needs and stayed undecided
    level_s = max(1.0, min(settings.slo.level_max_s, cap_s))
    slo = settings.slo.model_copy(update={"level_max_s": level_s})
    return settings.model_copy(update={"limit": limit, "slo": slo})


def _run_trial(
    context: ExperimentContext, config: TuneConfig, trial: PlannedTrial, search: SuccessiveHalving
) -> TuneLine:
    """One trial (see the module docstring), as its tune.jsonl line."""
    assert context.servers is not None
    settings = context.settings
    label = f"{EXPERIMENT} r{trial.rung.index} {config.key}"
    flags = config.server_flags(settings, label)
    trial_settings = _trial_settings(settings, trial, search.budget_s - search.elapsed_s)
    trial_run = context.run.with_settings(trial_settings)
    shortened = trial_settings.limit.time_cap_s < trial.rung.time_cap_s
    base = TuneLine(
        kind="trial",
        run_id=context.run.run_id,
        quant=context.target.quant,
        server=context.target.name,
        key=config.key,
        rung=trial.rung.index,
        label=label,
        args=list(flags.extra_args),
        slots=config.slots,
        ctx_per_slot=config.ctx_per_slot,
        cache_type=config.cache_type,
        objective=settings.tune.objective,
    )
    started = time.monotonic()
    outcome: SearchOutcome | None = None
    try:
        with context.servers.variant(flags) as variant:
            check = speculation_before(config.speculation != "none", variant)
            problem = check.why if check is not None and not check.speculating else None
            if problem is None:
                outcome = run_limit_search(
                    objective_search(settings), ExperimentContext(trial_run, variant.target), variant=label
                )
                problem = server_gone(variant.target)
                stage_ids = {s.stage_id for s in outcome.summaries}
                check = speculation_after(check, trial_run, variant, stage_ids) if problem is None else check
                if problem is None and check is not None and not check.speculating:
                    problem = check.why
            append_variant(context.run.run_dir, variant_line(context.run.run_id, EXPERIMENT, variant, check))
    except QuantloadError as error:
        problem = error.one_line()
    if problem is not None or outcome is None:
        return base.model_copy(
            update={"ran": False, "why": problem or "", "seconds": round(time.monotonic() - started, 3)}
        )
    goodput, tokens = _at_limit(outcome)
    return base.model_copy(
        update={
            "limit": outcome.result.limit,
            "lowest_miss": outcome.result.lowest_miss,
            "undecided": list(outcome.result.undecided),
            "goodput_rps": goodput,
            "output_tok_s": tokens,
            "memory_mib": memory_mib(variant),
            "kv_mib": variant.kv.predicted_mib if variant.kv is not None else None,
            "model_mib": variant.kv.buffer_mib("model") if variant.kv is not None else None,
            "buffers_mib": _buffers_mib(variant.kv),
            "seconds": round(time.monotonic() - started, 3),
            "why": outcome.line.sentence,
            "cut_short": shortened and outcome.result.ending == "capped",
        }
    )


def _baseline(context: ExperimentContext, search: SuccessiveHalving) -> TuneLine:
    """The server as configured, searched as the finalists were: the final rung's time cap and
    level budget, within what is left of `tune.budget_s` (at least its reserve)."""
    final = search.rungs[-1]
    settings = context.settings
    reserve = baseline_reserve_s(settings, final.time_cap_s)
    left_s = max(settings.tune.budget_s - search.elapsed_s, reserve)
    cap_s = max(1.0, min(final.time_cap_s, left_s))
    limit = settings.limit.model_copy(
        update={"time_cap_s": cap_s, "trial_seconds": max(2.0, min(settings.limit.trial_seconds, cap_s))}
    )
    slo = settings.slo.model_copy(update={"level_max_s": max(1.0, min(settings.slo.level_max_s, cap_s))})
    run = context.run.with_settings(settings.model_copy(update={"limit": limit, "slo": slo}))
    label = f"{EXPERIMENT} baseline"
    run.progress(0, None, f"{context.target.name} tune: the configured flags, as the finalists were searched")
    started = time.monotonic()
    outcome = run_limit_search(
        objective_search(settings), ExperimentContext(run, context.target), variant=label
    )
    goodput, tokens = _at_limit(outcome)
    gone = server_gone(context.target)
    return TuneLine(
        kind="baseline",
        ran=gone is None,
        run_id=run.run_id,
        quant=context.target.quant,
        server=context.target.name,
        key="configured flags",
        rung=final.index,
        label=label,
        slots=settings.server.slots,
        ctx_per_slot=settings.server.ctx_per_slot,
        cache_type=settings.server.cache_type_k,
        limit=outcome.result.limit,
        lowest_miss=outcome.result.lowest_miss,
        undecided=list(outcome.result.undecided),
        objective=settings.tune.objective,
        goodput_rps=goodput,
        output_tok_s=tokens,
        seconds=round(time.monotonic() - started, 3),
        why=gone or outcome.line.sentence,
    )


def _progress(
    progress: ProgressCallback, search: SuccessiveHalving, trial: PlannedTrial, server: str
) -> ProgressCallback:
    """The search's bar: trials done of those planned, with an ETA from the trials' pace (never
    past the budget) in its note."""
    done = len(search.scores)
    mean_s = search.elapsed_s / done if done else trial.rung.time_cap_s
    left_s = min((search.planned_trials - done) * mean_s, max(0.0, search.budget_s - search.elapsed_s))
    said = (
        f"{server} tune: rung {trial.rung.index + 1}/{len(search.rungs)}, {trial.key}; about"
        f" {duration(left_s)} left"
    )

    def show(completed: float, total: float | None, note: str = "") -> None:
        share = completed / total if total else 0.0
        progress(done + min(share, 0.99), search.planned_trials, said)

    progress(done, search.planned_trials, said)
    return show


def screen_space(
    context: ExperimentContext,
    configs: list[TuneConfig],
    earlier: list[TuneLine],
    measure_cost: CostMeasure | None,
) -> tuple[Screening, bool]:
    """`tune.predict_first`'s screening (quantload.tune.predicted): the one the state recorded, or
    a new one from cost curves measured now (True: new, its lines still to append)."""
    recorded = screening_of(earlier)
    if recorded is not None:
        return recorded, False
    if measure_cost is None:
        raise ConfigError(
            "tune.predict_first needs llama-batched-bench's cost curves, and this tune cannot measure them",
            "run it through quantload tune, or set tune.predict_first = false",
        )
    settings, name = context.settings, context.target.name
    predictions = predict_space(
        settings, configs, measure_cost, lambda said: context.run.progress(0, None, f"{name} tune: {said}")
    )
    always = [key] if (key := configured_key(settings, configs)) is not None else []
    return screen(predictions, always), True


def tune_quant(
    context: ExperimentContext,
    resume_from: Path | None = None,
    model: str = "",
    measure_cost: CostMeasure | None = None,
) -> TuneOutcome:
    """Tune the target's server (see the module docstring); with `resume_from` (a tune.jsonl) the
    trials already there are taken as measured and the search goes on from them
    (quantload.tune.resume). `model` names the model file tuned (`model_identity`). With
    `tune.predict_first` the search runs only over the configurations the prediction kept
    (`measure_cost` measures a combination's cost curves; a resume takes the recorded screening)."""
    settings, run = context.settings, context.run
    if context.servers is None:
        raise ConfigError(
            "quantload tune restarts llama-server with each configuration", "run it through quantload"
        )
    configs = configurations(settings)
    state = run.run_dir.tune_state_path
    key = space_key(settings, model)
    screening: Screening | None = None
    new_screening = False
    if settings.tune.predict_first:
        earlier_lines = (
            resumable_lines(resume_from, context.target.quant, model, key) if resume_from is not None else []
        )
        screening, new_screening = screen_space(context, configs, earlier_lines, measure_cost)
        run.progress(0, None, f"{context.target.name} tune: {screening.sentence()}")
    kept = set(screening.kept) if screening is not None else {config.key for config in configs}
    search = new_search(settings, [config.key for config in configs if config.key in kept])
    resumed = (
        resume_tune(resume_from, context.target.quant, model, key, search)
        if resume_from is not None
        else Resumed.nothing()
    )
    for note in resumed.notes:
        run.warn(f"{context.target.quant} tune: {note}")
    earlier = list(resumed.lines)
    trials = list(resumed.trials)
    pending = list(resumed.pending)
    if not earlier:
        append_tune_line(
            state,
            TuneLine(
                kind="start",
                run_id=run.run_id,
                quant=context.target.quant,
                server=context.target.name,
                model=model or None,
                space_key=key,
                objective=settings.tune.objective,
                configs=[c.key for c in configs],
                rungs=rung_dicts(search.rungs),
                budget_s=settings.tune.budget_s,
            ),
        )
    if screening is not None and new_screening:
        for line in screen_lines(screening, run.run_id, context.target.quant, context.target.name):
            append_tune_line(state, line)
    busy = 0.0
    by_key = {config.key: config for config in configs}
    while (trial := search.next_trial()) is not None:
        shown = _progress(run.progress, search, trial, context.target.name)
        line = _run_trial(
            ExperimentContext(run.with_progress(shown), context.target, context.servers),
            by_key[trial.key],
            trial,
            search,
        )
        append_tune_line(state, line)
        search.record(line.score())
        trials.append(line)
        trials += take_planned(search, pending)
        busy += line.seconds
    notes = list(resumed.notes)
    if (left := left_out_note(pending, state)) is not None:
        run.warn(f"{context.target.quant} tune: {left}")
        notes.append(left)
    baseline = resumed.baseline
    if baseline is None and settings.tune.baseline:
        baseline = _baseline(ExperimentContext(run.with_progress(run.progress), context.target), search)
        append_tune_line(state, baseline)
        busy += baseline.seconds
    outcome = TuneOutcome(
        context.target.quant, context.target.name, tuple(configs), search, tuple(trials), busy, baseline,
        settings.slo.confidence, tuple(notes), screening,
    )  # fmt: skip
    best = search.winner()
    append_tune_line(
        state,
        TuneLine(
            kind="end",
            run_id=run.run_id,
            quant=context.target.quant,
            server=context.target.name,
            winner=best.key if best is not None else None,
            ending=outcome.ending,
            seconds=round(search.elapsed_s, 3),
        ),
    )
    run.progress(
        search.planned_trials, search.planned_trials, f"{context.target.name} tune: {outcome.ending}"
    )
    return outcome
