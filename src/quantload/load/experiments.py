"""The load experiments, run from plain Python: what `quantload load` and `quantload run` call.

    summaries = run_sweep(target, settings.load, run_dir, run_id, progress, observe=settings.observe)
    summaries = run_open_loop(target, settings.load, run_dir, run_id, progress, observe=settings.observe)
    summaries = run_prefix_cache_experiment(target, settings.load, run_dir, run_id, progress,
                                            observe=settings.observe)
    summaries = run_workload_sweep(target, settings, run_dir, run_id, progress)    # workload.kind
    summaries = run_workload_open_loop(target, settings, run_dir, run_id, progress)
    summaries = run_sessions(target, settings, run_dir, run_id, progress)
    summaries = run_trace(target, settings, run_dir, run_id, progress)
    summaries = run_mixed(target, settings, run_dir, run_id, progress, restarts)

Each call builds the experiment's plan (`quantload.load.plan`, `quantload.load.traffic_plans`)
for one served target and runs it with `quantload.load.supervisor.run_plan`; it returns one
`StageSummary` per stage. What is wrong with a plan before it starts (more users than requests,
a prompt set cycled) goes to `warn`, one line each, before any of its load. The target's API key
goes to the load processes through their environment, never into the plan. The limit search is
`quantload.load.limit_runner.run_limit_search`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from quantload.config import LoadSettings, ObserveSettings, Settings
from quantload.load.lengths import LengthDistribution
from quantload.load.plan import LoadPlan, open_loop_plan, prefix_cache_plan, sweep_plan
from quantload.load.prompts import Prompt, select_prompts
from quantload.load.shared_prefix import build_system_prompt, erase_slots
from quantload.load.summary import StageSummary
from quantload.load.supervisor import LoadError, run_plan
from quantload.load.traffic_plans import (
    long_request_count,
    mixed_plan,
    sessions_plan,
    trace_plan,
    workload_open_loop_plan,
    workload_sweep_plan,
)
from quantload.load.workload_builder import ALL_PROMPTS, WorkloadBuilder
from quantload.load.workloads import LengthsWorkload, cycle_prompts, cycling_note
from quantload.progress import ProgressCallback, no_progress
from quantload.served import ServedTarget

PREFIX_USER_MAX_TOKENS = 256  # the prompt-cache experiment's user turns stay short beside the prefix
Warn = Callable[[str], None]
_log = logging.getLogger(__name__)


def log_warning(line: str) -> None:
    """The default `warn`: the line goes to the log."""
    _log.warning("%s", line)


class ServerRestarts(Protocol):
    """Restarts the target's server with extra flags (the same model, port and names)."""

    def restart(self, extra_args: Sequence[str]) -> ServedTarget:
        """The server runs again with `extra_args` added to its usual flags (none: as it was)."""
        ...


def _prompts(
    settings: LoadSettings, prompts: Sequence[Prompt] | None, notes: list[str] | None = None
) -> list[Prompt]:
    """The prompts of a stage: `load.prompt_count` of the set, cycled when the set is smaller
    (and `notes` gets the line that says so)."""
    if prompts is not None:
        return list(prompts)
    available = select_prompts(
        settings.prompts,
        ALL_PROMPTS,
        settings.min_prompt_tokens,
        settings.max_prompt_tokens,
        Path.cwd(),
    )
    if settings.prompt_count > len(available) and notes is not None:
        notes.append(cycling_note(settings.prompts, len(available), settings.prompt_count))
    return cycle_prompts(available, settings.prompt_count)


def _run(
    plan: LoadPlan,
    settings: LoadSettings,
    run_dir: Path,
    api_key: str | None,
    progress: ProgressCallback,
    observe: ObserveSettings | None,
    warn: Warn,
    notes: Sequence[str] = (),
) -> list[StageSummary]:
    """Say what is wrong with the plan, then run it."""
    if notes:
        plan = plan.model_copy(update={"notes": (*notes, *plan.notes)})
    for line in plan.warnings():
        warn(line)
    return run_plan(plan, settings, run_dir, api_key, progress, observe=observe)


def invocation_id(experiment: str, target: ServedTarget) -> str:
    """A fresh id for one experiment at one target: every stage id and log name starts with it."""
    label = "".join(c if c.isalnum() or c in "-_." else "_" for c in target.name)[:40]
    return f"{experiment}-{label}-{uuid.uuid4().hex[:6]}"


def run_sweep(
    target: ServedTarget,
    settings: LoadSettings,
    run_dir: Path,
    run_id: str,
    progress: ProgressCallback = no_progress,
    prompts: Sequence[Prompt] | None = None,
    *,
    observe: ObserveSettings | None = None,
    warn: Warn = log_warning,
) -> list[StageSummary]:
    """Closed loop: the prompt set at each of `settings.users`, `settings.repeats` times."""
    notes: list[str] = []
    chosen = _prompts(settings, prompts, notes)
    plan = sweep_plan(settings, target, chosen, run_id, invocation_id("sweep", target))
    return _run(plan, settings, run_dir, target.api_key_text, progress, observe, warn, notes)


def run_open_loop(
    target: ServedTarget,
    settings: LoadSettings,
    run_dir: Path,
    run_id: str,
    progress: ProgressCallback = no_progress,
    rates_rps: Sequence[float] | None = None,
    prompts: Sequence[Prompt] | None = None,
    *,
    observe: ObserveSettings | None = None,
    warn: Warn = log_warning,
) -> list[StageSummary]:
    """Open loop: Poisson arrivals at each rate (default `settings.rates_rps`)."""
    rates = tuple(rates_rps if rates_rps is not None else settings.rates_rps)
    if not rates:
        raise LoadError("no open-loop rate given", "set load.rates_rps, e.g. [0.5, 1, 2]")
    if any(rate <= 0 for rate in rates):
        raise LoadError(f"open-loop rates must be positive, got {list(rates)}")
    plan = open_loop_plan(
        settings,
        target,
        _prompts(settings, prompts),
        run_id,
        invocation_id("open_loop", target),
        rates,
    )
    return _run(plan, settings, run_dir, target.api_key_text, progress, observe, warn)


def run_prefix_cache_experiment(
    target: ServedTarget,
    settings: LoadSettings,
    run_dir: Path,
    run_id: str,
    progress: ProgressCallback = no_progress,
    reset_server: Callable[[], None] | None = None,
    prompts: Sequence[Prompt] | None = None,
    *,
    observe: ObserveSettings | None = None,
    warn: Warn = log_warning,
) -> list[StageSummary]:
    """Shared system prompt of `settings.prefix_tokens`: cache_prompt off, then on, repeated.

    The user turns after the shared prefix are the selected prompts of at most 256 tokens (all of
    them if none is that short), cycled to `settings.prefix_requests` requests per stage.

    Before it starts, `reset_server` (if given, e.g. a restart) runs, then every slot is erased
    where the server allows it (`POST /slots/{id}?action=erase`, needs --slot-save-path). The
    states measured do not depend on either: "off" sends cache_prompt=false (every prompt token is
    computed), "on" is measured after warm-up requests (one per user) put the prefix in the slots.
    Every stage line states the server state it ran in.
    """
    if settings.prefix_tokens <= 0 or settings.prefix_requests <= 0:
        return []
    api_key = target.api_key_text
    text, tokens = build_system_prompt(target.url, settings.prefix_tokens, api_key)
    states = []
    if reset_server is not None:
        reset_server()
        states.append("server restarted")
    states.append(erase_slots(target.url, api_key))
    states.append(f"prefix primed by {settings.prefix_users} warm-up request(s)")
    candidates = _prompts(settings, prompts)
    short = [p for p in candidates if p.tokens <= PREFIX_USER_MAX_TOKENS] or candidates
    plan = prefix_cache_plan(
        settings,
        target,
        short,
        text,
        tokens,
        run_id,
        invocation_id("prefix_cache", target),
        "; ".join(states),
    )
    return _run(plan, settings, run_dir, api_key, progress, observe, warn)


# ---------------------------------------------------------------------- the traffic experiments


def _rates(settings: LoadSettings, rates_rps: Sequence[float] | None) -> tuple[float, ...]:
    rates = tuple(rates_rps if rates_rps is not None else settings.rates_rps)
    if not rates:
        raise LoadError("no open-loop rate given", "set load.rates_rps, e.g. [0.5, 1, 2]")
    if any(rate <= 0 for rate in rates):
        raise LoadError(f"open-loop rates must be positive, got {list(rates)}")
    return rates


def _requests_per_stage(settings: Settings) -> int:
    return settings.load.prompt_count if settings.workload.kind == "prompts" else settings.workload.requests


def run_workload_sweep(
    target: ServedTarget,
    settings: Settings,
    run_dir: Path,
    run_id: str,
    progress: ProgressCallback = no_progress,
    warn: Warn = log_warning,
) -> list[StageSummary]:
    """The concurrency sweep with `workload.kind`'s requests (sessions: `sessions.count`)."""
    load = settings.load
    with WorkloadBuilder(settings, target, progress=progress) as builder:
        workload = builder.workload()
        count = settings.sessions.count if workload.name == "sessions" else _requests_per_stage(settings)
        invocation = invocation_id("sweep", target)
        drawn = workload.stage_requests(count, load.seed, f"{invocation}-")
    plan = workload_sweep_plan(load, target, drawn, run_id, invocation)
    return _run(plan, load, run_dir, target.api_key_text, progress, settings.observe, warn)


def run_workload_open_loop(
    target: ServedTarget,
    settings: Settings,
    run_dir: Path,
    run_id: str,
    progress: ProgressCallback = no_progress,
    rates_rps: Sequence[float] | None = None,
    warn: Warn = log_warning,
) -> list[StageSummary]:
    """Poisson arrivals of `workload.kind`'s requests at each rate (load.open_loop_requests each)."""
    load = settings.load
    rates = _rates(load, rates_rps)
    with WorkloadBuilder(settings, target, progress=progress) as builder:
        invocation = invocation_id("open_loop", target)
        drawn = builder.workload().stage_requests(load.open_loop_requests, load.seed, f"{invocation}-")
    plan = workload_open_loop_plan(load, target, drawn, run_id, invocation, rates)
    return _run(plan, load, run_dir, target.api_key_text, progress, settings.observe, warn)


def run_sessions(
    target: ServedTarget,
    settings: Settings,
    run_dir: Path,
    run_id: str,
    progress: ProgressCallback = no_progress,
    warn: Warn = log_warning,
) -> list[StageSummary]:
    """Multi-turn conversations at `sessions.users` at once, one stage per cache mode, repeated.

    Every turn sends the whole history with the server's actual replies; records carry the
    session id and turn, and each reply's `timings.cache_n` says how much of that history the
    server found in its cache.
    """
    sessions, load = settings.sessions, settings.load
    if sessions.count <= 0:
        return []
    invocation = invocation_id("sessions", target)
    with WorkloadBuilder(settings, target, progress=progress) as builder:
        workload = builder.sessions()
        drawn = [
            (cache_on, workload.stage_requests(sessions.count, load.seed + index, f"{invocation}-m{index}-"))
            for index, cache_on in enumerate(sessions.cache_modes)
        ]
    plan = sessions_plan(load, target, drawn, sessions.users, run_id, invocation, sessions.repeats)
    return _run(plan, load, run_dir, target.api_key_text, progress, settings.observe, warn)


def run_trace(
    target: ServedTarget,
    settings: Settings,
    run_dir: Path,
    run_id: str,
    progress: ProgressCallback = no_progress,
    warn: Warn = log_warning,
) -> list[StageSummary]:
    """`trace.path` replayed open loop at `trace.speed` (its first `trace.max_requests`)."""
    load, trace = settings.load, settings.trace
    invocation = invocation_id("trace", target)
    with WorkloadBuilder(settings, target, progress=progress) as builder:
        workload = builder.trace_workload()
        drawn = workload.stage_requests(len(workload.trace), load.seed, f"{invocation}-", speed=trace.speed)
    plan = trace_plan(load, target, drawn, trace.speed, run_id, invocation)
    return _run(plan, load, run_dir, target.api_key_text, progress, settings.observe, warn)


def batch_args(pair: str) -> tuple[str, ...]:
    """llama-server flags of a "B/UB" batch-size pair."""
    logical, _, physical = pair.partition("/")
    return ("-b", logical, "-ub", physical)


def run_mixed(
    target: ServedTarget,
    settings: Settings,
    run_dir: Path,
    run_id: str,
    progress: ProgressCallback = no_progress,
    restarts: ServerRestarts | None = None,
    warn: Warn = log_warning,
) -> list[StageSummary]:
    """The mixed-traffic diagnosis at each of `mixed.batch_sizes`.

    Decode-heavy requests (short prompt, long output) alone, then the same requests with long
    prompts mixed in at `mixed.long_fraction`. With `restarts` the server is restarted at each
    batch size (`-b B -ub UB`) and once more as it was at the end; without (a server quantload did
    not start), the experiment runs once at the server's own batch size and says so.
    """
    mixed, load = settings.mixed, settings.load
    pairs: list[str | None] = list(mixed.batch_sizes) if restarts is not None else [None]
    if restarts is None and len(mixed.batch_sizes) > 1:
        warn(
            "mixed: the server was not started by quantload, so it cannot be restarted at"
            f" {', '.join(mixed.batch_sizes)}; measured once at its own batch size"
        )
    summaries: list[StageSummary] = []
    current = target
    try:
        for index, pair in enumerate(pairs):
            if pair is not None and restarts is not None:
                progress(0, None, f"{target.name}: restarting llama-server with -b/-ub {pair}")
                current = restarts.restart(batch_args(pair))
            invocation = invocation_id("mixed", current)
            with WorkloadBuilder(settings, current) as builder:
                decode = _fixed(builder, mixed.decode_prompt_tokens, mixed.decode_output_tokens)
                long = _fixed(builder, mixed.long_prompt_tokens, mixed.long_output_tokens)
                seed = load.seed + index
                decode_drawn = decode.stage_requests(mixed.decode_requests, seed, f"{invocation}-d")
                long_drawn = long.stage_requests(long_request_count(mixed), seed, f"{invocation}-l")
            label = f"-b {pair.replace('/', ' -ub ')}" if pair is not None else "server's own batch size"
            plan = mixed_plan(load, mixed, current, decode_drawn, long_drawn, label, run_id, invocation)
            summaries += _run(plan, load, run_dir, current.api_key_text, progress, settings.observe, warn)
    finally:
        if restarts is not None:
            progress(0, None, f"{target.name}: restarting llama-server as it was")
            restarts.restart(())
    return summaries


def _fixed(builder: WorkloadBuilder, prompt_tokens: int, output_tokens: int) -> LengthsWorkload:
    fixed_in = LengthDistribution("fixed", low=prompt_tokens)
    fixed_out = LengthDistribution("fixed", low=output_tokens)
    return LengthsWorkload(builder.maker, fixed_in, fixed_out, builder.slots_and_context[1])
