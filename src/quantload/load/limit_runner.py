"""The limit search run for real: trial stages against a target until `LimitSearch` has its answer.

Each trial is one stage (experiment `limit_users` or `limit_rate`) of the configured workload at
one level, run as its own plan so the next level can depend on what this one said. A trial holds
when its TTFT p99 (open loop: from the intended send time) and TPOT p99 are within the SLO and
at most 1 % of its requests failed; it fails hard (its level breaks at once, no repeats) when the
stage did not end ok (circuit breaker, stage timeout) or at least `limit.hard_failure_frac` of its
requests failed. A closed-loop trial sends `limit.requests_per_user` requests per user (at least
`limit.min_requests`), an open-loop one `limit.trial_seconds` worth at its rate.

The outcome is appended to `limits.jsonl` (`quantload.load.limit_file`, one line per search) when
the search ends; every trial's records and stage lines are in records.jsonl and stages.jsonl as
they happen, so an interrupted search loses nothing it measured.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from quantload.config import ReportSettings, Settings
from quantload.load.limit_file import LimitLine, SearchExperiment, TrialLine
from quantload.load.limit_search import LimitResult, LimitSearch, Trial, level_text
from quantload.load.records import JsonlAppender, RequestRecord, iter_records
from quantload.load.summary import StageSummary
from quantload.load.supervisor import LoadError, run_plan
from quantload.load.traffic_plans import trial_plan
from quantload.load.workload_builder import WorkloadBuilder
from quantload.progress import ProgressCallback, no_progress
from quantload.rundir import LIMITS_JSONL, RECORDS_JSONL
from quantload.served import ServedTarget
from quantload.stats import percentile

MAX_FAILED_FRAC = 0.01


@dataclass(frozen=True)
class TrialVerdict:
    """What one trial said about its level."""

    held: bool
    hard_failure: bool
    why: str


def judge_trial(
    summary: StageSummary | None,
    records: Sequence[RequestRecord],
    slo: ReportSettings,
    open_loop: bool,
    hard_failure_frac: float,
) -> TrialVerdict:
    """The SLO verdict of one trial stage from its summary and its (measured) records."""
    if summary is None:
        return TrialVerdict(False, True, "the trial stage never ended")
    planned = max(summary.requests_planned, 1)
    failed_frac = 1.0 - summary.requests_ok / planned
    if summary.status != "ok":
        return TrialVerdict(False, True, f"stage {summary.status}: {summary.reason}")
    if failed_frac >= hard_failure_frac:
        return TrialVerdict(False, True, f"{failed_frac:.0%} of requests failed")
    ok = [r for r in records if r.ok and not r.warmup]
    ttft = [r.ttft_from_intended_s if open_loop else r.ttft_s for r in ok]
    ttft_p99 = percentile([v for v in ttft if v is not None], 99)
    tpot_p99 = percentile([r.tpot_s for r in ok if r.tpot_s is not None], 99)
    reasons = []
    if ttft_p99 is None:
        return TrialVerdict(False, True, "no request succeeded")
    if ttft_p99 > slo.slo_ttft_p99_s:
        reasons.append(f"TTFT p99 {ttft_p99 * 1000:.0f} ms")
    if tpot_p99 is not None and tpot_p99 > slo.slo_tpot_s:
        reasons.append(f"TPOT p99 {tpot_p99 * 1000:.0f} ms")
    if failed_frac > MAX_FAILED_FRAC:
        reasons.append(f"{failed_frac:.0%} failed")
    if reasons and summary.client_saturated:
        reasons.append("the load generator itself was saturated (its delay is inside these figures)")
    held = not reasons
    detail = f"TTFT p99 {ttft_p99 * 1000:.0f} ms" + (
        f", TPOT p99 {tpot_p99 * 1000:.0f} ms" if tpot_p99 else ""
    )
    return TrialVerdict(held, False, detail if held else "; ".join(reasons))


@dataclass(frozen=True)
class SearchOutcome:
    """What a search ran (every trial's stage summary) and what it found."""

    summaries: tuple[StageSummary, ...]
    result: LimitResult
    line: LimitLine


def trial_requests(settings: Settings, experiment: SearchExperiment, level: float) -> int:
    """How many requests (conversations, for the sessions workload) a trial at `level` sends."""
    limit = settings.limit
    if experiment == "limit_users":
        return max(limit.min_requests, int(level) * limit.requests_per_user)
    return max(limit.min_requests, math.ceil(level * limit.trial_seconds))


def run_limit_search(
    experiment: SearchExperiment,
    target: ServedTarget,
    settings: Settings,
    run_dir: Path,
    run_id: str,
    progress: ProgressCallback = no_progress,
    warn: Callable[[str], None] | None = None,
) -> SearchOutcome:
    """Search one target's limit (see the module docstring); the outcome is in limits.jsonl too."""
    limit, load = settings.limit, settings.load
    users = experiment == "limit_users"
    kind: Literal["users", "rate_rps"] = "users" if users else "rate_rps"
    if users and limit.max_users < limit.start_users:
        raise LoadError("limit.max_users is below limit.start_users", "raise limit.max_users")
    if not users and limit.max_rate_rps < limit.start_rate_rps:
        raise LoadError("limit.max_rate_rps is below limit.start_rate_rps", "raise limit.max_rate_rps")
    search = LimitSearch(
        kind=kind,
        start=limit.start_users if users else limit.start_rate_rps,
        max_level=limit.max_users if users else limit.max_rate_rps,
        growth=limit.growth,
        resolution=limit.rate_resolution,
        repeats=limit.repeats,
        time_cap_s=limit.time_cap_s,
    )
    search_id = f"{experiment}-{_label(target.name)}-{uuid.uuid4().hex[:6]}"
    summaries: list[StageSummary] = []
    stage_of: list[str | None] = []
    started = time.monotonic()
    with WorkloadBuilder(settings, target, progress=progress) as builder:
        workload = builder.workload()
        while (level := search.next_level()) is not None:
            trial = len(search.trials)
            note: str = f"{target.name} {experiment}: trial {trial + 1} at {level_text(level, kind)}"
            progress(min(search.elapsed_s, limit.time_cap_s), limit.time_cap_s, note)
            tag = f"{search_id}-t{trial}-"
            drawn = workload.stage_requests(
                trial_requests(settings, experiment, level), load.seed + trial, tag
            )
            plan = trial_plan(
                load,
                target,
                drawn,
                experiment,
                level,
                run_id,
                f"{search_id}-t{trial}",
                trial,
                limit.trial_timeout_s,
            )
            if warn is not None and trial == 0:
                for line in plan.warnings():
                    warn(line)
            before = time.monotonic()
            shown = _within(progress, search.elapsed_s, limit.time_cap_s, note)
            done = run_plan(plan, load, run_dir, target.api_key_text, shown, observe=settings.observe)
            seconds = time.monotonic() - before
            summary = done[0] if done else None
            head = f"{plan.invocation}-"
            records = [
                r for r in iter_records(run_dir / RECORDS_JSONL) if (r.stage_id or "").startswith(head)
            ]
            verdict = judge_trial(summary, records, settings.report, not users, limit.hard_failure_frac)
            search.record(Trial(level, verdict.held, verdict.hard_failure, seconds, verdict.why))
            summaries += done
            stage_of.append(summary.stage_id if summary is not None else None)
    result = search.result()
    found = LimitLine(
        run_id=run_id,
        server=target.name,
        quant=target.quant,
        experiment=experiment,
        kind=kind,
        workload=workload.name,
        slo_ttft_p99_s=settings.report.slo_ttft_p99_s,
        slo_tpot_s=settings.report.slo_tpot_s,
        limit=result.limit,
        confirmed=result.confirmed,
        ending=result.ending,
        lowest_broken=result.lowest_broken,
        seconds=round(time.monotonic() - started, 3),
        sentence=result.sentence(),
        trials=[
            TrialLine(
                level=t.level,
                held=t.held,
                hard_failure=t.hard_failure,
                seconds=round(t.seconds, 3),
                why=t.why,
                stage_id=stage,
            )
            for t, stage in zip(result.trials, stage_of, strict=True)
        ],
        unix_s=time.time(),
    )
    appender = JsonlAppender(run_dir / LIMITS_JSONL)
    try:
        appender.append_line(found.model_dump_json(by_alias=True))
    finally:
        appender.close()
    progress(limit.time_cap_s, limit.time_cap_s, f"{target.name} {experiment}: {result.sentence()}")
    return SearchOutcome(tuple(summaries), result, found)


def _label(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)[:40]


def _within(progress: ProgressCallback, elapsed_s: float, cap_s: float, trial_note: str) -> ProgressCallback:
    """A trial's own progress as the search's: the bar follows the time cap, the note the trial."""

    def show(completed: float, total: float | None, note: str = "") -> None:
        progress(min(elapsed_s, cap_s), cap_s, f"{trial_note}: {int(completed)}/{int(total or 0)} requests")

    return show
