"""The noisy neighbour's stages: each tenant's share of a stage at its own load, the neighbour's at
each step of `noisy_neighbour.steps`, drawn before any is sent and run through the load supervisor
(the experiment as a whole: the package docstring)."""

from __future__ import annotations

from dataclasses import dataclass

from quantload.config import Settings, TenantSettings
from quantload.errors import ConfigError, QuantloadError
from quantload.experiments.base import ExperimentContext, ExperimentRun, experiment_run
from quantload.experiments.running import invocation_id, run_stages
from quantload.load.plan import (
    LoadPlan,
    PlannedRequest,
    StagePlan,
    assemble_plan,
    poisson_requests,
    stage_plan,
)
from quantload.load.records import TenantLoad
from quantload.load.workload_builder import WorkloadBuilder
from quantload.load.workloads import StageRequests
from quantload.served import ServedTarget

NAME = "noisy_neighbour"


def missing(settings: Settings) -> str | None:
    return None if len(settings.tenants) >= 2 else "fewer than two [[tenants]]"


def step_text(tenant: TenantSettings, step: float) -> str:
    """A neighbour's load in words: '4 users' or '2 req/s'."""
    if tenant.open_loop:
        return f"{step:g} req/s"
    return f"{int(step)} user{'s' if int(step) != 1 else ''}"


def tenant_settings(settings: Settings, tenant: TenantSettings) -> Settings:
    """The run's settings with the tenant's own workload and conversations in place."""
    return settings.model_copy(
        update={
            "workload": tenant.workload or settings.workload,
            "sessions": tenant.sessions or settings.sessions,
        }
    )


@dataclass(frozen=True)
class TenantShare:
    """One tenant's part of one stage: its load and its requests."""

    load: TenantLoad
    requests: tuple[PlannedRequest, ...]
    drawn: StageRequests


def tenant_share(
    settings: Settings, builder: WorkloadBuilder, tenant: TenantSettings, load: float, seed: int, tag: str
) -> TenantShare:
    """`tenant`'s requests of one stage at `load` (users, or requests/s for an open-loop tenant),
    each labelled with its name; a workload that cannot be made is a ConfigError naming it."""
    noisy = settings.noisy_neighbour
    try:
        workload = builder.workload()
        if tenant.open_loop:
            count = max(1, round(load * noisy.step_seconds))
            drawn = workload.stage_requests(count, seed, tag)
            requests = poisson_requests(drawn, load, seed)
            users = tenant.rate_users
        else:
            users = int(load)
            drawn = workload.stage_requests(noisy.requests_per_user * users, seed, tag)
            requests = drawn.requests
    except QuantloadError as error:
        raise ConfigError(f"tenant {tenant.name!r}: {error.problem}", error.hint) from None
    labelled = tuple(
        r.model_copy(update={"tenant": tenant.name, "ignore_eos": bool(drawn.ignore_eos)}) for r in requests
    )
    rate = load if tenant.open_loop else None
    return TenantShare(
        TenantLoad(name=tenant.name, users=users, rate_rps=rate, requests=len(labelled)), labelled, drawn
    )


def stage_requests(shares: list[TenantShare]) -> tuple[PlannedRequest, ...]:
    """The stage's requests: scheduled arrivals in time order first, then the closed-loop ones."""
    scheduled = sorted(
        (r for s in shares for r in s.requests if r.offset_s is not None), key=lambda r: r.offset_s or 0.0
    )
    closed = [r for s in shares for r in s.requests if r.offset_s is None]
    return (*scheduled, *closed)


def neighbour_plan(
    settings: Settings, target: ServedTarget, stages_shares: list[tuple[float, int, list[TenantShare]]],
    run_id: str, invocation: str,
) -> LoadPlan:  # fmt: skip
    """One stage per (step, repeat): every tenant's share together, each tenant at most its users
    in flight."""
    load, noisy = settings.load, settings.noisy_neighbour
    neighbour = settings.neighbour_tenant
    assert neighbour is not None
    stages: list[StagePlan] = []
    parts: list[StageRequests] = []
    for step, repeat, shares in stages_shares:
        requests = stage_requests(shares)
        open_loop = any(share.load.rate_rps is not None for share in shares)
        rate = sum(share.load.rate_rps or 0.0 for share in shares) if open_loop else None
        overhead = next(
            (s.drawn.template_overhead_tokens for s in shares if s.drawn.template_overhead_tokens), None
        )
        mixture = StageRequests(requests, {}, "tenants", None, overhead)
        parts += [share.drawn for share in shares]
        stages.append(
            stage_plan(
                load, invocation, len(stages), NAME, sum(share.load.users for share in shares), mixture,
                arrival="poisson" if open_loop else "closed", rate_rps=rate, requests=requests, repeat=repeat,
                cache_prompt=noisy.cache_prompt, phase=f"{neighbour.name} at {step_text(neighbour, step)}",
                tenants=tuple(share.load for share in shares),
                server_state=f"cache_prompt {'on' if noisy.cache_prompt else 'off'}",
            )
        )  # fmt: skip
    return assemble_plan(load, target, run_id, invocation, parts, stages)


def plan_stages(context: ExperimentContext, invocation: str) -> LoadPlan:
    """Every stage's requests, drawn before any is sent (a tenant's bad workload stops it here)."""
    settings = context.settings
    neighbour = settings.neighbour_tenant
    assert neighbour is not None
    builders = {
        tenant.name: WorkloadBuilder(tenant_settings(settings, tenant), context.target, context.run.cwd)
        for tenant in settings.tenants
    }
    try:
        stages_shares: list[tuple[float, int, list[TenantShare]]] = []
        seed = settings.load.seed
        for repeat in range(settings.noisy_neighbour.repeats):
            for step in settings.noisy_neighbour.steps:
                index = len(stages_shares)
                shares = []
                for number, tenant in enumerate(settings.tenants):
                    load = step if tenant.name == neighbour.name else (tenant.rate_rps or tenant.users or 0)
                    if load <= 0:
                        continue
                    tag = f"{invocation}-{index}-{tenant.name}-"
                    shares.append(
                        tenant_share(
                            settings, builders[tenant.name], tenant, load, seed + 101 * index + number, tag
                        )
                    )
                stages_shares.append((step, repeat, shares))
    finally:
        for builder in builders.values():
            builder.close()
    return neighbour_plan(settings, context.target, stages_shares, context.run.run_id, invocation)


def run(context: ExperimentContext) -> ExperimentRun:
    invocation = invocation_id(NAME, context.target)
    plan = plan_stages(context, invocation)
    return experiment_run(NAME, run_stages(context, plan).summaries)
