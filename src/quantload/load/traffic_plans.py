"""The stages of the traffic experiments, as data: a workload's requests put into plans.

- `workload_sweep_plan`: the concurrency sweep with any workload (the same requests at each level).
- `workload_open_loop_plan`: one stage per rate, Poisson arrivals over the workload's requests.
- `sessions_plan`: multi-turn conversations, one stage per cache mode (cache_prompt off, then on).
- `trace_plan`: a trace replayed open loop at a speed factor, latency from the intended send time.
- `mixed_plan`: decode-heavy requests alone, then with long prompts mixed in (one batch size).
- `trial_plan`: one stage of the limit search at one level (users or a rate).

Each stage of these is bounded in requests (its workload's count) and in time
(load.stage_timeout_s, or limit.trial_timeout_s for a trial).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from quantload.config import LoadSettings, MixedSettings
from quantload.errors import ConfigError
from quantload.load.plan import (
    LoadPlan,
    PlannedRequest,
    StagePlan,
    assemble_plan,
    crowding_warning,
    poisson_offsets,
    warmup_requests,
)
from quantload.load.prompts import warmup_prompt
from quantload.load.records import Experiment
from quantload.load.workloads import StageRequests
from quantload.served import ServedTarget


def _texts(*parts: StageRequests) -> dict[str, str]:
    table = {warmup_prompt().id: warmup_prompt().text}
    for part in parts:
        table.update(part.texts)
    return table


def _stage(
    settings: LoadSettings,
    invocation: str,
    index: int,
    experiment: Experiment,
    users: int,
    drawn: StageRequests,
    *,
    rate_rps: float | None = None,
    repeat: int = 0,
    cache_prompt: bool | None = None,
    requests: Sequence[PlannedRequest] | None = None,
    phase: str | None = None,
    server_args: str | None = None,
    timeout_s: float | None = None,
    warning: str | None = None,
) -> StagePlan:
    chosen = tuple(requests if requests is not None else drawn.requests)
    closed = rate_rps is None
    crowded = crowding_warning(
        users, len(chosen), "conversations" if drawn.workload == "sessions" else "requests"
    )
    return StagePlan(
        stage_id=f"{invocation}-{index}",
        index=index,
        experiment=experiment,
        users=users,
        rate_rps=rate_rps,
        repeat=repeat,
        cache_prompt=settings.cache_prompt if cache_prompt is None else cache_prompt,
        warmup=warmup_requests(settings.warmup_requests),
        requests=chosen,
        first_round_jitter_s=settings.first_round_jitter_s if closed else 0.0,
        timeout_s=timeout_s if timeout_s is not None else settings.stage_timeout_s,
        ignore_eos=drawn.ignore_eos,
        workload=drawn.workload,
        phase=phase,
        server_args=server_args,
        warning="; ".join(w for w in (warning, crowded if closed else None) if w) or None,
        template_overhead_tokens=drawn.template_overhead_tokens,
    )


def _with_notes(plan: LoadPlan, *parts: StageRequests) -> LoadPlan:
    notes = tuple(dict.fromkeys(note for part in parts for note in part.notes))
    return plan.model_copy(update={"notes": plan.notes + notes})


def workload_sweep_plan(
    settings: LoadSettings, target: ServedTarget, drawn: StageRequests, run_id: str, invocation: str
) -> LoadPlan:
    """Closed loop: the workload's requests at each user level, the whole sweep repeated."""
    stages: list[StagePlan] = []
    for repeat in range(settings.repeats):
        for users in settings.users:
            stages.append(_stage(settings, invocation, len(stages), "sweep", users, drawn, repeat=repeat))
    return _with_notes(assemble_plan(settings, target, run_id, invocation, _texts(drawn), stages), drawn)


def _poisson(drawn: StageRequests, rate_rps: float, seed: int) -> tuple[PlannedRequest, ...]:
    offsets = poisson_offsets(rate_rps, len(drawn.requests), seed)
    return tuple(r.model_copy(update={"offset_s": o}) for r, o in zip(drawn.requests, offsets, strict=True))


def workload_open_loop_plan(
    settings: LoadSettings,
    target: ServedTarget,
    drawn: StageRequests,
    run_id: str,
    invocation: str,
    rates_rps: Sequence[float],
) -> LoadPlan:
    """Open loop: one stage per rate, Poisson arrivals over the workload's requests."""
    stages = [
        _stage(
            settings,
            invocation,
            index,
            "open_loop",
            settings.open_loop_users,
            drawn,
            rate_rps=rate,
            requests=_poisson(drawn, rate, settings.seed + index),
        )
        for index, rate in enumerate(rates_rps)
    ]
    return _with_notes(assemble_plan(settings, target, run_id, invocation, _texts(drawn), stages), drawn)


def sessions_plan(
    settings: LoadSettings,
    target: ServedTarget,
    drawn_per_mode: Sequence[tuple[bool, StageRequests]],
    users: int,
    run_id: str,
    invocation: str,
    repeats: int = 1,
) -> LoadPlan:
    """Conversations in flight at `users` at once, one stage per cache mode, repeated.

    Each stage has conversations of its own (`drawn_per_mode`), so the cache-on stage cannot
    reuse what an earlier stage left in the slots.
    """
    stages: list[StagePlan] = []
    for repeat in range(repeats):
        for cache_on, drawn in drawn_per_mode:
            stages.append(
                _stage(
                    settings,
                    invocation,
                    len(stages),
                    "sessions",
                    users,
                    drawn,
                    repeat=repeat,
                    cache_prompt=cache_on,
                    phase=f"cache {'on' if cache_on else 'off'}",
                )
            )
    parts = [drawn for _, drawn in drawn_per_mode]
    return _with_notes(assemble_plan(settings, target, run_id, invocation, _texts(*parts), stages), *parts)


def trace_plan(
    settings: LoadSettings,
    target: ServedTarget,
    drawn: StageRequests,
    speed: float,
    run_id: str,
    invocation: str,
) -> LoadPlan:
    """The trace replayed open loop at `speed`; `drawn` carries the send offsets. A replay whose
    last send would come after load.stage_timeout_s is refused before it starts (ConfigError)."""
    last = max((r.offset_s or 0.0 for r in drawn.requests), default=0.0)
    if last > settings.stage_timeout_s:
        raise ConfigError(
            f"the trace's last request would be sent {last:,.0f} s into the replay at speed x{speed:g},"
            f" after load.stage_timeout_s = {settings.stage_timeout_s:,.0f} s ends the stage",
            "replay it faster (--speed), keep fewer requests (trace.max_requests), or raise"
            " load.stage_timeout_s",
        )
    stage = _stage(
        settings,
        invocation,
        0,
        "trace",
        settings.open_loop_users,
        drawn,
        rate_rps=(len(drawn.requests) - 1) / last if last > 0 else float(len(drawn.requests)),
        phase=f"speed x{speed:g}",
        timeout_s=settings.stage_timeout_s,
    )
    return _with_notes(assemble_plan(settings, target, run_id, invocation, _texts(drawn), [stage]), drawn)


def interleave(decode: Sequence[PlannedRequest], long: Sequence[PlannedRequest]) -> list[PlannedRequest]:
    """The long requests spread evenly among the decode-heavy ones (never two long ones first)."""
    if not long:
        return list(decode)
    merged: list[PlannedRequest] = []
    every = (len(decode) + len(long)) / len(long)
    slots = {round(every * (k + 0.5)) for k in range(len(long))}
    queue_decode, queue_long = list(decode), list(long)
    for position in range(len(decode) + len(long)):
        take_long = (position in slots and queue_long) or not queue_decode
        merged.append(queue_long.pop(0) if take_long else queue_decode.pop(0))
    return merged


def long_request_count(settings: MixedSettings) -> int:
    """Long prompts in the mixed stage: the set fraction of all its requests."""
    fraction = settings.long_fraction
    return max(1, round(settings.decode_requests * fraction / (1.0 - fraction)))


def mixed_plan(
    settings: LoadSettings,
    mixed: MixedSettings,
    target: ServedTarget,
    decode: StageRequests,
    long: StageRequests,
    server_args: str,
    run_id: str,
    invocation: str,
) -> LoadPlan:
    """Decode-heavy traffic alone, then the same with long prompts mixed in, at one batch size."""
    decode_requests = tuple(r.model_copy(update={"request_class": "decode"}) for r in decode.requests)
    long_requests = tuple(r.model_copy(update={"request_class": "long_prompt"}) for r in long.requests)
    alone = replace(decode, requests=decode_requests)
    together = replace(decode, requests=tuple(interleave(decode_requests, long_requests)))
    stages: list[StagePlan] = []
    for repeat in range(mixed.repeats):
        for phase, drawn in (("alone", alone), ("mixed", together)):
            stages.append(
                _stage(
                    settings,
                    invocation,
                    len(stages),
                    "mixed",
                    mixed.users,
                    drawn,
                    repeat=repeat,
                    cache_prompt=False,
                    phase=phase,
                    server_args=server_args,
                )
            )
    return _with_notes(
        assemble_plan(settings, target, run_id, invocation, _texts(decode, long), stages), decode, long
    )


def trial_plan(
    settings: LoadSettings,
    target: ServedTarget,
    drawn: StageRequests,
    experiment: Experiment,
    level: float,
    run_id: str,
    invocation: str,
    trial: int,
    timeout_s: float,
    open_loop_users: int | None = None,
) -> LoadPlan:
    """One limit-search trial: `level` users (closed loop) or requests/s (open loop, Poisson)."""
    if experiment == "limit_rate":
        stage = _stage(
            settings,
            invocation,
            0,
            experiment,
            open_loop_users or settings.open_loop_users,
            drawn,
            rate_rps=level,
            requests=_poisson(drawn, level, settings.seed + trial) if not _has_offsets(drawn) else None,
            timeout_s=timeout_s,
            phase=f"trial {trial}",
        )
    else:
        stage = _stage(
            settings,
            invocation,
            0,
            experiment,
            int(level),
            drawn,
            timeout_s=timeout_s,
            phase=f"trial {trial}",
        )
    plan = assemble_plan(settings, target, run_id, invocation, _texts(drawn), [stage])
    return _with_notes(plan, drawn)


def _has_offsets(drawn: StageRequests) -> bool:
    return bool(drawn.requests) and all(r.offset_s is not None for r in drawn.requests)


__all__ = [
    "interleave",
    "long_request_count",
    "mixed_plan",
    "sessions_plan",
    "trace_plan",
    "trial_plan",
    "workload_open_loop_plan",
    "workload_sweep_plan",
]
