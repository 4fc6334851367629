"""The prompt-cache experiment's stages: cache_prompt off, then on (primed by warm-ups), the pair
repeated (the experiment as a whole: the package docstring)."""

from __future__ import annotations

from quantload.config import LoadSettings, Settings
from quantload.experiments.base import ExperimentContext, ExperimentRun, experiment_run
from quantload.experiments.running import invocation_id, run_stages, workloads
from quantload.load.plan import LoadPlan, StagePlan, assemble_plan, stage_plan, warmup_requests
from quantload.load.prompts import Prompt
from quantload.load.shared_prefix import build_system_prompt, erase_slots
from quantload.load.workloads import StageRequests, cycle_prompts
from quantload.served import ServedTarget

NAME = "prefix_cache"
USER_TURN_MAX_TOKENS = 256  # the user turns stay short beside the prefix
SYSTEM_PROMPT_ID = "system-prefix"


def missing(settings: Settings) -> str | None:
    load = settings.load
    if load.prefix_requests <= 0 or load.prefix_tokens <= 0:
        return "load.prefix_tokens or load.prefix_requests is 0"
    return None


def user_turns(settings: Settings, prompt_set: list[Prompt]) -> StageRequests:
    """The user turns after the prefix: short prompts of the set, cycled to load.prefix_requests."""
    candidates = cycle_prompts(prompt_set, settings.load.prompt_count)
    short = [p for p in candidates if p.tokens <= USER_TURN_MAX_TOKENS] or candidates
    chosen = [short[i % len(short)] for i in range(settings.load.prefix_requests)]
    return StageRequests.of_prompts(chosen)


def prefix_cache_plan(
    load: LoadSettings,
    target: ServedTarget,
    turns: StageRequests,
    system_prompt: str,
    system_tokens: int,
    run_id: str,
    invocation: str,
    server_state: str,
) -> LoadPlan:
    """cache_prompt off, then on (primed by warm-ups), the pair repeated."""
    priming = warmup_requests(load.prefix_users)  # the warm-up prompt: no measured prompt is cached whole
    stages: list[StagePlan] = []
    for repeat in range(load.repeats):
        for cache_on in (False, True):
            stages.append(
                stage_plan(
                    load, invocation, len(stages), NAME, load.prefix_users, turns,
                    repeat=repeat, cache_prompt=cache_on, warmup=priming if cache_on else (),
                    system_prompt_id=SYSTEM_PROMPT_ID, prefix_tokens=system_tokens,
                    server_state=server_state if cache_on else "cache_prompt off: no reuse",
                )
            )
    texts = {SYSTEM_PROMPT_ID: system_prompt}
    return assemble_plan(load, target, run_id, invocation, [turns], stages, texts)


def run(context: ExperimentContext) -> ExperimentRun:
    settings, target = context.settings, context.target
    api_key = target.api_key_text
    text, tokens = build_system_prompt(target.url, settings.load.prefix_tokens, api_key)
    states = [
        erase_slots(target.url, api_key),
        f"prefix primed by {settings.load.prefix_users} warm-up request(s)",
    ]
    with workloads(context) as builder:
        turns = user_turns(settings, builder.prompts)
    invocation = invocation_id(NAME, target)
    plan = prefix_cache_plan(
        settings.load, target, turns, text, tokens, context.run.run_id, invocation, "; ".join(states)
    )
    return experiment_run(NAME, run_stages(context, plan).summaries)

