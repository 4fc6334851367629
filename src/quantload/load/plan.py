"""The load plan: what every stage sends, built in the parent and handed to the Locust process.

A plan is data (JSON): the target, the request parameters, the prompt texts by id, and an
ordered list of stages. Each stage names its users, its arrival process (closed loop, Poisson or
a trace: quantload.slo.Arrival), its warm-up requests and its measured requests (prompt ids,
plus the intended send offset for open-loop arrivals). Every experiment builds its stages with
`stage_plan` from a workload's `StageRequests` and puts them together with `assemble_plan`
(quantload.experiments); each stage is bounded in requests and in time (`timeout_s`).
"""

from __future__ import annotations

__all__ = [
    "LoadPlan",
    "PlannedRequest",
    "PlannedTurn",
    "StageDecision",
    "StagePlan",
    "assemble_plan",
    "decided_timeout_s",
    "poisson_requests",
    "requests_before_a_miss_stops",
    "stage_decision",
    "stage_plan",
    "warmup_requests",
]

import random
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from quantload.config import LoadSettings, SloSettings
from quantload.load.prompts import warmup_prompt
from quantload.load.records import Experiment, StageEvent, TenantLoad
from quantload.served import ServedTarget
from quantload.slo import Arrival, Slo

if TYPE_CHECKING:
    from quantload.load.workloads import StageRequests

API_KEY_ENV = "QL_TARGET_API_KEY"  # how the load processes get the key: never in a plan file


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RequestParams(_Frozen):
    """What every request of a plan sends besides its messages."""

    max_tokens: int = 128
    temperature: float = 0.0
    seed: int = 42
    ignore_eos: bool = False
    request_timeout_s: float = 300.0
    connect_timeout_s: float = 10.0
    first_byte_timeout_s: float = 60.0
    path: str = "/v1/chat/completions"
    reuse_connections: str = "auto"
    extra_body: dict[str, Any] = Field(default_factory=dict)


class PlannedTurn(_Frozen):
    """A later turn of a conversation: the user text it adds, its output length, the pause before it."""

    prompt_id: str
    max_tokens: int | None = None
    think_s: float = 0.0


class PlannedRequest(_Frozen):
    """One request of a stage: which prompt, and (open loop) when relative to the stage start.

    A workload may set the request's own output length (`max_tokens`, else the plan's), the
    prompt length it asked for, its class (the mixed experiment), its tenant (a stage shared by
    tenants) and, for a multi-turn conversation, the session id, the slot it is pinned to and the
    turns that follow this one: the user who takes it sends them in order, each with the whole
    history so far.
    """

    prompt_id: str
    offset_s: float | None = None
    max_tokens: int | None = None
    prompt_tokens_asked: int | None = None
    request_class: str | None = None
    tenant: str | None = None
    ignore_eos: bool | None = None  # overrides the stage's (a tenant's workload among others)
    session_id: str | None = None
    id_slot: int | None = None
    later_turns: tuple[PlannedTurn, ...] = ()

    @property
    def record_count(self) -> int:
        """Records this request yields: one per turn."""
        return 1 + len(self.later_turns)


ContextPolicy = Literal["fail", "trim", "shift"]


class StageDecision(_Frozen):
    """How a stage decides its level as it goes (quantload.slo, quantload.load.level_judgement).

    Stages naming the same `level` (a sweep level's repeats) decide it together: each sends at
    least its planned requests, then, while the level is undecided and its budget (`max_requests`
    records and `max_s` seconds of sending, its stages together) lasts, the same requests again;
    once the level misses, a stage stops after `min_requests`, once it meets, after its planned
    requests.
    """

    level: str
    slo: Slo
    max_requests: int = Field(gt=0)
    max_s: float = Field(gt=0)
    min_requests: int = Field(default=1, ge=1)


class StagePlan(_Frozen):
    """One stage: its users, warm-up and measured requests, and its bounds.

    A stage shared by tenants lists each one's load (`tenants`): a tenant's requests are never more
    at once than its users (the ticket book holds the rest back), so each keeps its own
    concurrency within the stage's `users` (their sum). A conversation stage of the context
    experiment says how a history beyond the slot is met (`context_policy`): fail (the server's
    default: the turn is refused), trim (the client drops the earliest turns that do not fit, the
    system prompt kept, counted with the server's tokenizer) or shift (the server's
    `--context-shift`); `slot_context_tokens` is the slot's context, and `breaker_ignores` the
    error classes the stage expects (they do not count towards its circuit breaker).
    """

    stage_id: str
    index: int
    experiment: Experiment
    users: int
    arrival: Arrival = "closed"
    rate_rps: float | None = None
    repeat: int = 0
    cache_prompt: bool
    kv_cache_type: str | None = None  # the served K and V cache type, where the stage compares them
    system_prompt_id: str | None = None
    warmup: tuple[PlannedRequest, ...] = ()
    requests: tuple[PlannedRequest, ...]
    first_round_jitter_s: float = 0.0
    timeout_s: float = 3600.0
    prefix_tokens: int | None = None
    server_state: str | None = None
    ignore_eos: bool | None = None  # overrides the plan's (workloads that enforce lengths)
    workload: str | None = None
    phase: str | None = None
    server_args: str | None = None
    warning: str | None = None
    template_overhead_tokens: int | None = None
    tenants: tuple[TenantLoad, ...] = ()
    context_policy: ContextPolicy | None = None
    slot_context_tokens: int | None = None
    breaker_ignores: tuple[str, ...] = ()
    # A timed stage (the soak's slices): closed loop, its requests are handed out again and again
    # until this long after its start, then the ones in flight finish (quantload.load.timed_supply);
    # open loop, its arrivals were scheduled within it.
    duration_s: float | None = Field(default=None, gt=0)
    # A decided stage (the sweep's levels, the limit search's trials): its requests are sent again
    # while its level is undecided and its budget lasts (StageDecision).
    decision: StageDecision | None = None

    @property
    def tenant_users(self) -> dict[str, int]:
        """Each tenant's most requests at once."""
        return {tenant.name: tenant.users for tenant in self.tenants}

    @property
    def measured_records(self) -> int:
        """Records the measured requests yield (a conversation yields one per turn)."""
        return sum(request.record_count for request in self.requests)


class LoadPlan(_Frozen):
    """Everything one Locust process (or master) needs to run its stages."""

    run_id: str
    invocation: str
    target: ServedTarget  # dumped without its API key
    params: RequestParams
    prompts: dict[str, str]
    stages: tuple[StagePlan, ...]
    notes: tuple[str, ...] = ()  # what to say about the plan before it starts (e.g. cycled prompts)
    max_consecutive_errors: int = 20
    abort_grace_s: float = 10.0
    saturation_cpu_frac: float = 0.9
    saturation_lag_s: float = 0.05
    # what the client's figures are held to (quantload.load.client_health.TrustBounds): the error
    # they are stated within, the event-loop lateness beyond which they may not be, and the streams
    # one process measured right on this machine (its latest `quantload calibrate`; None: not
    # calibrated here). The supervisor fills them in.
    trust_error_s: float = 0.005
    trust_lag_s: float = 0.005
    calibrated_streams_per_process: float | None = None

    @property
    def total_requests(self) -> int:
        """Measured records the plan yields (one per request, one per turn of a conversation)."""
        return sum(stage.measured_records for stage in self.stages)

    def warnings(self) -> list[str]:
        """What to know about the plan before it starts, one line each: its notes, then what is
        wrong with each stage (e.g. more users than requests)."""
        stages = [f"stage {stage.stage_id}: {stage.warning}" for stage in self.stages if stage.warning]
        return [*self.notes, *stages]

    def stage_event(self, stage: StagePlan, event: str, unix_s: float, **fields: Any) -> StageEvent:
        """A stages.jsonl line for `stage`: the plan's labels and the stage's own, plus `fields`."""
        return StageEvent.model_validate(
            {
                "event": event,
                "unix_s": unix_s,
                "run_id": self.run_id,
                "server": self.target.name,
                "quant": self.target.quant,
                "model": self.target.model,
                "url": self.target.url,
                "experiment": stage.experiment,
                "stage_id": stage.stage_id,
                "stage_index": stage.index,
                "stage_users": stage.users,
                "stage_rate_rps": stage.rate_rps,
                "arrival": stage.arrival,
                "repeat": stage.repeat,
                "kv_cache_type": stage.kv_cache_type,
                "cache_prompt": stage.cache_prompt,
                "requests_planned": stage.measured_records,
                "prefix_tokens": stage.prefix_tokens,
                "server_state": stage.server_state,
                "workload": stage.workload,
                "phase": stage.phase,
                "server_args": stage.server_args,
                "warning": stage.warning,
                "template_overhead_tokens": stage.template_overhead_tokens,
                "tenants": [tenant.model_dump() for tenant in stage.tenants] or None,
                "context_policy": stage.context_policy,
                "slot_context_tokens": stage.slot_context_tokens,
                **fields,
            }
        )


def request_params(settings: LoadSettings) -> RequestParams:
    """Request parameters from the [load] settings."""
    return RequestParams(
        max_tokens=settings.max_tokens,
        temperature=settings.temperature,
        seed=settings.seed,
        ignore_eos=settings.ignore_eos,
        request_timeout_s=settings.request_timeout_s,
        connect_timeout_s=settings.connect_timeout_s,
        first_byte_timeout_s=settings.first_byte_timeout_s,
        reuse_connections=settings.reuse_connections,
    )


def crowding_warning(users: int, tickets: int, what: str = "requests") -> str | None:
    """The warning for a closed-loop stage with more users than requests to hand out, else None."""
    if users <= tickets:
        return None
    return (
        f"{users} users but only {tickets} {what}: at most {tickets} can be in flight at once"
        f" (fewer as the stage drains), so this stage does not measure {users} users;"
        " send more requests (load.prompt_count cycles the prompt set) or use fewer users"
    )


def warmup_requests(count: int) -> tuple[PlannedRequest, ...]:
    """`count` warm-up requests of the warm-up prompt (left out of every figure)."""
    return tuple(PlannedRequest(prompt_id=warmup_prompt().id) for _ in range(count))


def poisson_offsets(rate_rps: float, count: int, seed: int) -> list[float]:
    """Arrival times (s from the stage start) of a Poisson process, reproducible from `seed`."""
    rng = random.Random(seed)
    offsets, now = [], 0.0
    for _ in range(count):
        offsets.append(now)
        now += rng.expovariate(rate_rps)
    return offsets


def poisson_requests(drawn: StageRequests, rate_rps: float, seed: int) -> tuple[PlannedRequest, ...]:
    """The drawn requests sent as Poisson arrivals at `rate_rps`."""
    offsets = poisson_offsets(rate_rps, len(drawn.requests), seed)
    return tuple(r.model_copy(update={"offset_s": o}) for r, o in zip(drawn.requests, offsets, strict=True))


def stage_plan(
    settings: LoadSettings,
    invocation: str,
    index: int,
    experiment: Experiment,
    users: int,
    drawn: StageRequests,
    *,
    arrival: Arrival = "closed",
    rate_rps: float | None = None,
    repeat: int = 0,
    cache_prompt: bool | None = None,
    requests: Sequence[PlannedRequest] | None = None,
    warmup: Sequence[PlannedRequest] | None = None,
    timeout_s: float | None = None,
    warning: str | None = None,
    **labels: Any,
) -> StagePlan:
    """One stage of `drawn`'s requests (or `requests`, e.g. with send offsets).

    Closed loop: users start within `load.first_round_jitter_s` of each other and a stage with
    more users than requests gets its warning; open loop (`arrival` poisson or trace): the pool of
    `users` serves the scheduled arrivals at `rate_rps`. `labels` are further StagePlan fields
    (phase, server_args, system_prompt_id, prefix_tokens, server_state, kv_cache_type, tenants,
    context_policy, slot_context_tokens, breaker_ignores, duration_s).
    """
    chosen = tuple(requests if requests is not None else drawn.requests)
    closed = arrival == "closed"
    timed = labels.get("duration_s") is not None  # hands its requests out again: never crowded
    crowded = None if timed else crowding_warning(
        users, len(chosen), "conversations" if drawn.workload == "sessions" else "requests"
    )
    return StagePlan(
        stage_id=f"{invocation}-{index}",
        index=index,
        experiment=experiment,
        users=users,
        arrival=arrival,
        rate_rps=rate_rps,
        repeat=repeat,
        cache_prompt=settings.cache_prompt if cache_prompt is None else cache_prompt,
        warmup=tuple(warmup) if warmup is not None else warmup_requests(settings.warmup_requests),
        requests=chosen,
        first_round_jitter_s=settings.first_round_jitter_s if closed else 0.0,
        timeout_s=timeout_s if timeout_s is not None else settings.stage_timeout_s,
        ignore_eos=drawn.ignore_eos,
        workload=drawn.workload,
        warning="; ".join(w for w in (warning, crowded if closed else None) if w) or None,
        template_overhead_tokens=drawn.template_overhead_tokens,
        **labels,
    )


def requests_before_a_miss_stops(users: int) -> int:
    """The requests a level that misses still records: a request from each of its users, at least 2."""
    return max(users, 2)


def stage_decision(slo: SloSettings, level: str, users: int) -> StageDecision:
    """How a stage at `users` decides `level` under the [slo] settings: their SLO and budget; a
    level that misses stops once its users have sent a request each."""
    return StageDecision(
        level=level, slo=Slo.of(slo), max_requests=slo.level_max_requests, max_s=slo.level_max_s,
        min_requests=requests_before_a_miss_stops(users),
    )  # fmt: skip


def decided_timeout_s(timeout_s: float, slo: SloSettings) -> float:
    """A decided stage's time bound: its own for the planned requests, plus the level's budget."""
    return timeout_s + slo.level_max_s


def assemble_plan(
    settings: LoadSettings,
    target: ServedTarget,
    run_id: str,
    invocation: str,
    parts: Sequence[StageRequests],
    stages: Sequence[StagePlan],
    texts: dict[str, str] | None = None,
) -> LoadPlan:
    """The plan of `stages`, with the texts of every part they draw from (and `texts`, e.g. a
    shared system prompt) and the parts' notes."""
    table = {warmup_prompt().id: warmup_prompt().text}
    for part in parts:
        table.update(part.texts)
    table.update(texts or {})
    notes = tuple(dict.fromkeys(note for part in parts for note in part.notes))
    return LoadPlan(
        run_id=run_id,
        invocation=invocation,
        target=target,
        params=request_params(settings),
        prompts=table,
        stages=tuple(stages),
        notes=notes,
        max_consecutive_errors=settings.max_consecutive_errors,
        saturation_cpu_frac=settings.saturation_cpu_frac,
        saturation_lag_s=settings.saturation_lag_s,
    )
