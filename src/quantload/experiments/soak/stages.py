"""The soak's stages: one timed stage per slice of `soak.slice_s` at the level held (set, or from
the run's limit search less its headroom), run through the load supervisor while `watch.SoakWatch`
reads the server's memory and KV cells into soak.jsonl. The duration parser of `--duration` too."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Final

from quantload.config import Settings
from quantload.errors import ConfigError, QuantloadError
from quantload.experiments.base import ExperimentContext, ExperimentRun, experiment_run
from quantload.experiments.running import invocation_id, run_stages, workloads
from quantload.experiments.soak.watch import DockerMemory, MemoryProbe, ProcMemory, SoakLine, SoakWatch
from quantload.experiments.sweep import requests_per_stage
from quantload.load.limit_file import LimitLine
from quantload.load.limit_search import level_text
from quantload.load.plan import LoadPlan, StagePlan, assemble_plan, stage_plan
from quantload.load.workloads import StageRequests
from quantload.progress import ProgressCallback
from quantload.served import ServedTarget
from quantload.text_format import percent

NAME: Final = "soak"
SLICE_MARGIN_S = 60.0  # a slice's bound beyond its length and one request's deadline
DURATION_UNITS_S = {"s": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}


def missing(settings: Settings) -> str | None:
    return "soak.duration_s is 0 (give --duration)" if settings.soak.duration_s <= 0 else None


def duration_text_s(text: str) -> float:
    """A duration as people write it ("90", "90s", "20m", "1h", "1.5h") in seconds; ConfigError
    naming the text when it is none."""
    raw = text.strip().lower()
    number, unit = raw, "s"
    for suffix in sorted(DURATION_UNITS_S, key=len, reverse=True):
        if raw.endswith(suffix):
            number, unit = raw[: -len(suffix)].strip(), suffix
            break
    try:
        seconds = float(number) * DURATION_UNITS_S[unit]
    except ValueError:
        raise ConfigError(f"not a duration: {text!r}", "give seconds, or e.g. 90s, 20m, 1h") from None
    if not math.isfinite(seconds) or seconds < 0:
        raise ConfigError(f"not a duration: {text!r}", "give seconds, or e.g. 90s, 20m, 1h")
    return seconds


def slice_lengths(duration_s: float, slice_s: float) -> list[float]:
    """The slices of a soak: whole slices of `slice_s`, the last one what is left (a remainder
    under a tenth of a slice is added to the one before)."""
    whole = max(int(duration_s // slice_s), 1)
    lengths = [min(slice_s, duration_s)] * whole
    rest = duration_s - slice_s * whole
    if rest >= 0.1 * slice_s:
        lengths.append(rest)
    elif rest > 0:
        lengths[-1] += rest
    return lengths


@dataclass(frozen=True)
class SoakLevel:
    """The load held: users (closed loop) or a rate (open loop), where it came from, and why the
    limit it was to come from was not there (`fallback`)."""

    users: int | None
    rate_rps: float | None
    origin: str
    fallback: str | None = None

    def text(self) -> str:
        return f"{self.rate_rps:.3g} req/s" if self.rate_rps is not None else f"{self.users} users"


def soak_level(
    settings: Settings, limits: Sequence[LimitLine], target: ServedTarget, run_id: str
) -> SoakLevel:
    """The level the soak holds (see the module docstring); `limits` are the run's searches."""
    soak = settings.soak
    open_loop = soak.rate_rps is not None
    set_level = SoakLevel(
        None if open_loop else soak.users, soak.rate_rps, "soak.rate_rps" if open_loop else "soak.users"
    )
    if not soak.from_limit:
        return set_level
    search = "limit_rate" if open_loop else "limit_users"
    found = [
        line for line in limits
        if line.run_id == run_id and line.server == target.name and line.experiment == search
        and line.variant is None and line.limit is not None
    ]  # fmt: skip
    if not found:
        why = f"no {search} search of {target.name} found a limit in this run"
        return SoakLevel(set_level.users, set_level.rate_rps, f"{set_level.origin} ({why})", why)
    limit = float(found[-1].limit or 0.0)
    keep = 1.0 - settings.plan.headroom_frac
    shown = level_text(limit, "rate_rps") + " req/s" if open_loop else level_text(limit, "users") + " users"
    origin = (
        f"{search} found {shown},"
        f" {percent(settings.plan.headroom_frac, 0)} kept free (plan.headroom_frac)"
    )
    if open_loop:
        return SoakLevel(None, limit * keep, origin)
    return SoakLevel(max(1, math.floor(limit * keep)), None, origin)


def soak_plan(
    settings: Settings,
    target: ServedTarget,
    pool: StageRequests,
    level: SoakLevel,
    run_id: str,
    invocation: str,
) -> LoadPlan:
    """One timed stage per slice of the pool's requests at `level` (the first with warm-ups)."""
    load, soak = settings.load, settings.soak
    lengths = slice_lengths(soak.duration_s, soak.slice_s)
    stages: list[StagePlan] = []
    closed = level.rate_rps is None
    for index, seconds in enumerate(lengths):
        stage = stage_plan(
            load, invocation, index, NAME,
            (level.users or soak.users) if closed else load.open_loop_users, pool,
            arrival="closed" if closed else "poisson", rate_rps=level.rate_rps,
            warmup=None if index == 0 else (),
            timeout_s=seconds + load.request_timeout_s + SLICE_MARGIN_S,
            duration_s=seconds, phase=f"slice {index + 1}/{len(lengths)}",
            server_state=f"soak at {level.text()} ({level.origin})",
        )  # fmt: skip
        stages.append(stage)
    return assemble_plan(load, target, run_id, invocation, [pool], stages)


def draw_pool(context: ExperimentContext, invocation: str, users: int) -> StageRequests:
    """The soak's requests: as many as a sweep stage sends (at least one per user), without the
    send times a trace brings (the soak's arrivals are its own)."""
    settings = context.settings
    with workloads(context) as builder:
        workload = builder.workload()
        count = settings.sessions.count if workload.name == "sessions" else requests_per_stage(settings)
        drawn = workload.stage_requests(max(count, users, 1), settings.load.seed, f"{invocation}-")
    if any(request.offset_s is not None for request in drawn.requests):
        plain = tuple(request.model_copy(update={"offset_s": None}) for request in drawn.requests)
        drawn = dataclasses.replace(drawn, requests=plain)
    return drawn


def memory_probe(context: ExperimentContext) -> tuple[MemoryProbe | None, str | None]:
    """Where the server's memory is read, or None and why it is not."""
    soak = context.settings.soak
    if context.servers is not None:
        pid = context.servers.server_pid()
        if pid is not None:
            probe: MemoryProbe = ProcMemory(pid)
            return probe, None
    if soak.server_container:
        try:
            return DockerMemory(soak.server_container, context.run.environ), None
        except QuantloadError as error:
            return None, error.one_line()
    return None, (
        "the server is not a process quantload started; name its container in"
        " soak.server_container to read it through Docker"
    )


def run(context: ExperimentContext) -> ExperimentRun:
    settings, target, run_ctx = context.settings, context.target, context.run
    soak = settings.soak
    level = soak_level(settings, run_ctx.run_dir.limits(), target, run_ctx.run_id)
    if level.fallback is not None:
        run_ctx.warn(f"soak: {level.fallback}; holding {level.text()} ({level.origin.split(' (')[0]})")
    invocation = invocation_id(NAME, target)
    pool = draw_pool(context, invocation, level.users or 1)
    plan = soak_plan(settings, target, pool, level, run_ctx.run_id, invocation)
    memory, memory_missing = memory_probe(context)
    if memory_missing:
        run_ctx.warn(f"soak: server memory not measured: {memory_missing}")
    start = SoakLine(
        event="soak_start", unix_s=time.time(), run_id=run_ctx.run_id, invocation=invocation,
        server=target.name, quant=target.quant, users=level.users, rate_rps=level.rate_rps,
        level_from=level.origin, duration_s=soak.duration_s, slice_s=soak.slice_s,
        slices=len(plan.stages), memory_source=memory.source if memory else None,
        memory_missing=memory_missing,
    )  # fmt: skip
    note = f"{target.name}: soak at {level.text()} for {soak.duration_s:g} s"
    run_ctx.progress(0, soak.duration_s, note)
    by_time = run_ctx.with_progress(_by_time(run_ctx.progress, soak.duration_s, note))
    timed = dataclasses.replace(context, run=by_time)
    watch = SoakWatch(run_ctx.run_dir.soak_path, start, target, memory, soak.sample_s)
    with watch:
        outcome = run_stages(timed, plan)
    return experiment_run(NAME, outcome.summaries)


def _by_time(progress: ProgressCallback, duration_s: float, label: str) -> ProgressCallback:
    """The load's progress as the soak's: the bar follows the time held, the note the requests
    (a timed stage's count is not known ahead)."""
    started = time.monotonic()

    def show(completed: float, total: float | None, note: str = "") -> None:
        elapsed = min(time.monotonic() - started, duration_s)
        progress(elapsed, duration_s, f"{label}: {int(completed)} requests, {note}")

    return show

