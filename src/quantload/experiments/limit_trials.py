"""The limit search run for real: trial stages against a target until `LimitSearch` has its answer.

Each trial is one stage (experiment `limit_users` or `limit_rate`) of the configured workload at
one level, run as its own plan so the next level can depend on what this one said. A trial is
decided as it goes, by the SLO's one judge (quantload.slo), the same verdict the report gives a
sweep level: its stage sends its requests, and the same again while the level is undecided and
the [slo] budget lasts, then stops (a level that misses clearly, after a request per user). The
trial meets, misses or stays undecided; it misses hard (its level breaks at once) when the stage
did not end ok (circuit breaker, stage timeout) or at least `limit.hard_failure_frac` of its
requests failed. A closed-loop trial plans `limit.requests_per_user` requests per user, an
open-loop one `limit.trial_seconds` worth at its rate, and at least `fewest_requests`:
`limit.min_requests`, or unset, what a sweep stage sends (`load.prompt_count` prompts, in the same
order), so where the search's levels meet the sweep's, a trial sends the sweep stage's requests
first. Each trial reads only its own stage's summary (returned by the supervisor), so a long search
costs the same per trial from the first to the last.

The outcome is appended to `limits.jsonl` (`quantload.load.limit_file`, one line per search) when
the search ends; every trial's records, stage lines and summary are on disk as they happen, so an
interrupted search loses nothing it measured.
"""

from __future__ import annotations

import dataclasses
import math
import time
import uuid
from dataclasses import dataclass
from typing import Literal

from quantload.config import Settings
from quantload.errors import ConfigError
from quantload.experiments.base import ExperimentContext, ExperimentRun, experiment_run
from quantload.experiments.running import label, run_stages, workloads
from quantload.experiments.sweep import requests_per_stage
from quantload.load.limit_file import LimitLine, SearchExperiment, TrialLine
from quantload.load.limit_search import LimitResult, LimitSearch, Trial, TrialOutcome, level_text
from quantload.load.plan import (
    LoadPlan,
    assemble_plan,
    decided_timeout_s,
    poisson_requests,
    stage_decision,
    stage_plan,
)
from quantload.load.summary import StageSummary
from quantload.load.workloads import StageRequests
from quantload.progress import ProgressCallback
from quantload.served import ServedTarget
from quantload.slo import Slo, Verdict, judge


@dataclass(frozen=True)
class TrialVerdict:
    """What one trial said about its level, and what that rests on."""

    outcome: TrialOutcome
    hard_failure: bool
    why: str
    requests: int = 0
    sureness: str = ""


def judge_trial(summary: StageSummary | None, slo: Slo, hard_failure_frac: float) -> TrialVerdict:
    """The SLO verdict of one trial stage, from its summary (its level's requests are its own)."""
    if summary is None:
        return TrialVerdict("misses", True, "the trial stage never ended")
    if summary.status != "ok":
        return TrialVerdict("misses", True, f"stage {summary.status}: {summary.reason}", summary.requests)
    in_flight = summary.delivered_concurrency if summary.open_loop else summary.users
    verdict: Verdict = judge(
        summary.counts, slo, in_flight, hard_failure_frac, summary.machine_busy, summary.client_untrusted
    )
    if verdict.outcome == "unjudged":
        return TrialVerdict("misses", True, "no request was measured", 0, verdict.sureness)
    figures = _figures(summary)
    why = f"{figures}; {verdict.why}"
    if verdict.outcome == "misses" and summary.client_saturated:
        why += "; the load generator itself was saturated (its delay is inside these figures)"
    return TrialVerdict(verdict.outcome, verdict.hard_failure, why, verdict.requests, verdict.sureness)


def _figures(summary: StageSummary) -> str:
    ttft, tpot = summary.ttft_at_slo_s, summary.tpot_at_slo_s
    text = f"TTFT {summary.slo_ttft_percentile} {ttft * 1000:.0f} ms" if ttft is not None else "no TTFT"
    return text + (f", TPOT {summary.slo_tpot_percentile} {tpot * 1000:.0f} ms" if tpot else "")


@dataclass(frozen=True)
class SearchOutcome:
    """What a search ran (every trial's stage summary) and what it found."""

    summaries: tuple[StageSummary, ...]
    result: LimitResult
    line: LimitLine


def fewest_requests(settings: Settings) -> int:
    """The fewest requests a trial sends: `limit.min_requests`, or unset, a sweep stage's count."""
    limit = settings.limit
    return limit.min_requests if limit.min_requests is not None else requests_per_stage(settings)


def trial_requests(settings: Settings, experiment: SearchExperiment, level: float) -> int:
    """How many requests (conversations, for the sessions workload) a trial at `level` sends."""
    limit = settings.limit
    if experiment == "limit_users":
        return max(fewest_requests(settings), int(level) * limit.requests_per_user)
    return max(fewest_requests(settings), math.ceil(level * limit.trial_seconds))


def trial_plan(
    settings: Settings,
    target: ServedTarget,
    drawn: StageRequests,
    experiment: SearchExperiment,
    level: float,
    run_id: str,
    invocation: str,
    trial: int,
    variant: str | None = None,
) -> LoadPlan:
    """One trial: `level` users (closed loop) or requests/s (open loop: Poisson, or the trace's
    own arrivals when the workload brings them), decided as it goes; `variant` names the server
    flags it ran under."""
    load, limit = settings.load, settings.limit
    timeout_s = decided_timeout_s(limit.trial_timeout_s, settings.slo)
    if experiment == "limit_rate":
        own = bool(drawn.requests) and all(r.offset_s is not None for r in drawn.requests)
        stage = stage_plan(
            load, invocation, 0, experiment, load.open_loop_users, drawn,
            arrival="trace" if own else "poisson", rate_rps=level,
            requests=None if own else poisson_requests(drawn, level, load.seed + trial),
            timeout_s=timeout_s, phase=f"trial {trial}", server_args=variant,
            decision=stage_decision(settings.slo, invocation, max(1, math.ceil(level))),
        )  # fmt: skip
    else:
        stage = stage_plan(
            load, invocation, 0, experiment, int(level), drawn,
            timeout_s=timeout_s, phase=f"trial {trial}", server_args=variant,
            decision=stage_decision(settings.slo, invocation, int(level)),
        )  # fmt: skip
    return assemble_plan(load, target, run_id, invocation, [drawn], [stage])


def check_bounds(experiment: SearchExperiment, settings: Settings) -> None:
    """ConfigError when the search's bounds are the wrong way round."""
    limit = settings.limit
    if experiment == "limit_users" and limit.max_users < limit.start_users:
        raise ConfigError("limit.max_users is below limit.start_users", "raise limit.max_users")
    if experiment == "limit_rate" and limit.max_rate_rps < limit.start_rate_rps:
        raise ConfigError("limit.max_rate_rps is below limit.start_rate_rps", "raise limit.max_rate_rps")


def new_search(experiment: SearchExperiment, settings: Settings) -> LimitSearch:
    limit = settings.limit
    users = experiment == "limit_users"
    return LimitSearch(
        kind="users" if users else "rate_rps",
        start=limit.start_users if users else limit.start_rate_rps,
        max_level=limit.max_users if users else limit.max_rate_rps,
        growth=limit.growth,
        resolution=limit.rate_resolution,
        time_cap_s=limit.time_cap_s,
    )


def run_limit_search(
    experiment: SearchExperiment, context: ExperimentContext, variant: str | None = None
) -> SearchOutcome:
    """Search one target's limit (see the module docstring); the outcome is in limits.jsonl too.

    `variant` names the server flags the target runs under when an experiment searches a variant
    of the server (slots, batching, a tuned configuration): its trials' stages and its limits.jsonl
    line carry the name, and the capacity verdict, which is about the server as the run configured
    it, leaves such searches out.
    """
    settings, target, run = context.settings, context.target, context.run
    limit = settings.limit
    check_bounds(experiment, settings)
    search = new_search(experiment, settings)
    kind: Literal["users", "rate_rps"] = search.kind
    search_id = f"{experiment}-{label(target.name)}-{uuid.uuid4().hex[:6]}"
    summaries: list[StageSummary] = []
    trial_lines: list[TrialLine] = []
    started = time.monotonic()
    with workloads(context) as builder:
        workload = builder.workload()
        while (level := search.next_level()) is not None:
            trial = len(search.trials)
            note = f"{target.name} {experiment}: trial {trial + 1} at {level_text(level, kind)}"
            run.progress(min(search.elapsed_s, limit.time_cap_s), limit.time_cap_s, note)
            invocation = f"{search_id}-t{trial}"
            drawn = workload.stage_requests(
                trial_requests(settings, experiment, level), settings.load.seed + trial, f"{invocation}-"
            )
            plan = trial_plan(
                settings, target, drawn, experiment, level, run.run_id, invocation, trial, variant
            )
            shown = _within(run.progress, search.elapsed_s, limit.time_cap_s, note)
            quiet = context if trial == 0 else _quiet(context)  # a plan's warnings once per search
            before = time.monotonic()
            done = run_stages(_with_progress(quiet, shown), plan).summaries
            seconds = time.monotonic() - before
            summary = done[0] if done else None
            verdict = judge_trial(summary, run.slo, limit.hard_failure_frac)
            search.record(Trial(level, verdict.outcome, verdict.hard_failure, seconds, verdict.why))
            summaries += done
            trial_lines.append(
                TrialLine(
                    level=level, outcome=verdict.outcome, hard_failure=verdict.hard_failure,
                    seconds=round(seconds, 3), why=verdict.why,
                    stage_id=summary.stage_id if summary is not None else None,
                    requests=verdict.requests, sureness=verdict.sureness,
                )
            )
    result = search.result()
    found = LimitLine(
        run_id=run.run_id,
        server=target.name,
        quant=target.quant,
        experiment=experiment,
        kind=kind,
        workload=workload.name,
        slo_ttft_s=settings.slo.ttft_s,
        slo_tpot_s=settings.slo.tpot_s,
        slo_ttft_percentile=settings.slo.ttft_percentile,
        slo_tpot_percentile=settings.slo.tpot_percentile,
        slo_confidence=settings.slo.confidence,
        limit=result.limit,
        ending=result.ending,
        lowest_miss=result.lowest_miss,
        undecided=list(result.undecided),
        seconds=round(time.monotonic() - started, 3),
        sentence=result.sentence(),
        trials=trial_lines,
        unix_s=time.time(),
        variant=variant,
    )
    run.run_dir.append_limit(found)
    run.progress(limit.time_cap_s, limit.time_cap_s, f"{target.name} {experiment}: {result.sentence()}")
    return SearchOutcome(tuple(summaries), result, found)


def search_run(experiment: SearchExperiment, context: ExperimentContext) -> ExperimentRun:
    """The search as an experiment's run: its trials' stages and what it found."""
    outcome = run_limit_search(experiment, context)
    return experiment_run(experiment, outcome.summaries, outcome.line)


def _quiet(context: ExperimentContext) -> ExperimentContext:
    return dataclasses.replace(context, run=dataclasses.replace(context.run, warn=lambda line: None))


def _with_progress(context: ExperimentContext, progress: ProgressCallback) -> ExperimentContext:
    return dataclasses.replace(context, run=context.run.with_progress(progress))


def _within(progress: ProgressCallback, elapsed_s: float, cap_s: float, trial_note: str) -> ProgressCallback:
    """A trial's own progress as the search's: the bar follows the time cap, the note the trial."""

    def show(completed: float, total: float | None, note: str = "") -> None:
        sent = f"{int(completed)}/{int(total)}" if total else f"{int(completed)}"
        progress(min(elapsed_s, cap_s), cap_s, f"{trial_note}: {sent} requests")

    return show
