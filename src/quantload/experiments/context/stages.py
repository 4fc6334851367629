"""The context experiment's stages: one closed-loop stage of conversations per policy, on the
server variant the policy needs, drawn before any is sent and run through the load supervisor (the
experiment as a whole: the package docstring)."""

from __future__ import annotations

import contextlib
import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass

from quantload.config import CONTEXT_MARGIN_TOKENS, ContextSettings, Settings
from quantload.errors import ConfigError
from quantload.experiments.base import (
    ExperimentContext,
    ExperimentRun,
    ServerFlags,
    experiment_run,
)
from quantload.experiments.running import invocation_id, run_stages, workloads
from quantload.load.history_trim import whole_prompt_tokens
from quantload.load.lengths import parse_length_distribution
from quantload.load.plan import LoadPlan, assemble_plan, stage_plan
from quantload.load.summary import StageSummary
from quantload.load.workload_builder import WorkloadBuilder
from quantload.load.workloads import SessionWorkload, StageRequests
from quantload.served import ServedTarget

NAME = "context"
EXPECTED_ERRORS = ("context_exceeded", "session_cut")
HISTORY_MULTIPLE = 1.5  # the default turns take the mean conversation to this many slots
SHIFT_ARGS = "--context-shift"


def missing(settings: Settings) -> str | None:
    return None if settings.context.conversations > 0 else "context.conversations is 0"


def foreign(settings: Settings) -> str | None:
    """Shift alone measures nothing against a server quantload cannot restart with its flags."""
    if set(settings.context.policies) == {"shift"}:
        return (
            f"context.policies is only shift, which restarts the server with {SHIFT_ARGS}: a server"
            " quantload did not start cannot be, so nothing would be measured (add fail or trim to"
            " context.policies, or run it through `quantload run`)"
        )
    return None


@dataclass(frozen=True)
class SystemPrompt:
    """The system prompt of one stage's conversations, and its tokens as the server counts them."""

    prompt_id: str
    text: str
    whole_tokens: int  # the system message alone, as the chat template renders it


def default_turns(settings: ContextSettings, slot_tokens: int, system_tokens: int, overhead: int) -> int:
    """`context.turns`, or enough turns for the mean conversation to reach 1.5 slots."""
    if settings.turns:
        return settings.turns
    growth = (
        parse_length_distribution(settings.turn_tokens).expected_tokens
        + parse_length_distribution(settings.reply_tokens).expected_tokens
        + overhead
    )
    return max(2, min(200, math.ceil((HISTORY_MULTIPLE * slot_tokens - system_tokens) / max(growth, 1.0))))


def keep_tokens(settings: ContextSettings, system: SystemPrompt) -> int:
    """--keep of the shift policy's server: as set, else the whole system prompt."""
    return settings.keep_tokens if settings.keep_tokens is not None else system.whole_tokens


def system_prompt(builder: WorkloadBuilder, settings: ContextSettings, index: int, tag: str) -> SystemPrompt:
    """A system prompt of `context.system_prompt_tokens` tokens of its own for one stage."""
    text, _ = builder.maker.user_text(settings.system_prompt_tokens, 9_000_000 + index)
    whole = whole_prompt_tokens(builder.tokenizer, [{"role": "system", "content": text}])
    return SystemPrompt(f"{tag}system", text, whole)


def conversations(
    builder: WorkloadBuilder, settings: Settings, system: SystemPrompt, slot_tokens: int, seed: int, tag: str
) -> StageRequests:
    """The stage's conversations: each user turn clipped so that the system prompt, the turn and
    its reply always fit the slot (what the trim keeps at least); ConfigError when not even one
    token of user turn would."""
    context = settings.context
    reply = parse_length_distribution(context.reply_tokens)
    longest_reply = max(reply.sample(256, seed, minimum=1))
    overhead = builder.maker.overhead_tokens
    room = slot_tokens - system.whole_tokens - overhead - longest_reply - CONTEXT_MARGIN_TOKENS
    if room < 1:
        raise ConfigError(
            f"the trim policy cannot keep even the system prompt: its {system.whole_tokens} tokens, the"
            f" template's {overhead} and a {longest_reply}-token reply fill the server's"
            f" {slot_tokens}-token slot",
            "shorten context.system_prompt_tokens or context.reply_tokens, or raise context.ctx_per_slot",
        )
    dataset = builder.dataset(context.dataset, "context.dataset") if context.dataset else None
    workload = SessionWorkload(
        turns=default_turns(context, slot_tokens, system.whole_tokens, overhead),
        think_time_s=context.think_time_s,
        reply_tokens=reply,
        maker=builder.maker,
        turn_tokens=parse_length_distribution(context.turn_tokens) if dataset is None else None,
        dataset=dataset,
        count_tokens=builder.count_tokens,
        max_output_tokens=settings.workload.max_output_tokens,
        slots=builder.slots_and_context[0] if context.affinity == "id_slot" else None,
        context_tokens=slot_tokens,
        max_turn_tokens=room,
        warn_overflow=False,
    )
    return workload.stage_requests(context.conversations, seed, tag)


def policy_plan(
    settings: Settings,
    target: ServedTarget,
    drawn: StageRequests,
    system: SystemPrompt,
    run_id: str,
    invocation: str,
    policy: str,
    slot_tokens: int,
    server_args: str,
) -> LoadPlan:
    """One closed-loop stage of the conversations under `policy`."""
    context = settings.context
    cache = "on" if context.cache_prompt else "off"
    stage = stage_plan(
        settings.load, invocation, 0, NAME, context.users, drawn,
        cache_prompt=context.cache_prompt, phase=policy, system_prompt_id=system.prompt_id,
        context_policy=policy, slot_context_tokens=slot_tokens, breaker_ignores=EXPECTED_ERRORS,
        server_args=server_args, server_state=f"slots of {slot_tokens:,} tokens; cache_prompt {cache}",
    )  # fmt: skip
    return assemble_plan(
        settings.load, target, run_id, invocation, [drawn], [stage], {system.prompt_id: system.text}
    )


def _slot_tokens(builder: WorkloadBuilder, target: ServedTarget) -> int:
    slot_tokens = builder.slots_and_context[1]
    if slot_tokens is None:
        raise ConfigError(
            f"{target.url}/props does not say the server's slot context",
            "the context experiment needs llama-server's /props",
        )
    return slot_tokens


def _one_policy(
    context: ExperimentContext, target: ServedTarget, policy: str, index: int, server_args: str
) -> list[StageSummary]:
    settings = context.settings
    invocation = f"{invocation_id(NAME, target)}-{policy}"
    with workloads(context, target) as builder:
        slot_tokens = _slot_tokens(builder, target)
        system = system_prompt(builder, settings.context, index, f"{invocation}-")
        seed = settings.load.seed + index
        drawn = conversations(builder, settings, system, slot_tokens, seed, f"{invocation}-")
    plan = policy_plan(
        settings, target, drawn, system, context.run.run_id, invocation, policy, slot_tokens, server_args
    )
    return run_stages(context, plan).summaries


def server_flags(settings: ContextSettings, policy: str, keep: int) -> ServerFlags:
    """The variant a policy runs on: the experiment's slots, and the shift flags for shift."""
    shift = (SHIFT_ARGS, "--keep", str(keep)) if policy == "shift" else ()
    label = f"-np {settings.slots} ctx {settings.ctx_per_slot}" + (" " + " ".join(shift) if shift else "")
    slots, ctx = settings.slots, settings.ctx_per_slot
    return ServerFlags(slots=slots, ctx_per_slot=ctx, extra_args=shift, label=label)


def _measured_keep(context: ExperimentContext) -> int:
    """--keep for the shift policy, from the served model's own tokenizer (before any restart)."""
    settings = context.settings.context
    if settings.keep_tokens is not None:
        return settings.keep_tokens
    with workloads(context) as builder:
        return keep_tokens(settings, system_prompt(builder, settings, 0, "keep-"))


@contextlib.contextmanager
def _served(context: ExperimentContext, flags: ServerFlags) -> Iterator[ServedTarget]:
    assert context.servers is not None
    context.run.progress(0, None, f"{context.target.name}: llama-server {flags.label}")
    with context.servers.variant(flags) as variant:
        yield variant.target


def run(context: ExperimentContext) -> ExperimentRun:
    settings = context.settings.context
    policies = list(settings.policies)
    summaries: list[StageSummary] = []
    if context.servers is None:
        if "shift" in policies:
            policies.remove("shift")
            context.run.warn(
                "context: the server was not started by quantload, so it cannot be restarted with"
                f" {SHIFT_ARGS}: the shift policy is left out; fail and trim run at the server's own"
                " slot context (context.ctx_per_slot does not apply), and fail measures whatever"
                " context shift the server was started with"
            )
        if not policies:
            raise ConfigError(f"the {NAME} experiment cannot run: {foreign(context.settings)}")
        for index, policy in enumerate(policies):
            summaries += _one_policy(context, context.target, policy, index, "server's own flags")
        return experiment_run(NAME, summaries)
    keep = _measured_keep(context) if "shift" in policies else 0
    index = 0
    for flags, group in itertools.groupby(policies, key=lambda policy: server_flags(settings, policy, keep)):
        with _served(context, flags) as target:  # consecutive policies of the same flags share it
            for policy in group:
                summaries += _one_policy(context, target, policy, index, flags.label)
                index += 1
    return experiment_run(NAME, summaries)

