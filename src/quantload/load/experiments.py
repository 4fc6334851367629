"""The load experiments, run from plain Python: what `quantload load` and `quantload run` call.

    summaries = run_sweep(target, settings.load, run_dir, run_id, progress, observe=settings.observe)
    summaries = run_open_loop(target, settings.load, run_dir, run_id, progress, observe=settings.observe)
    summaries = run_prefix_cache_experiment(target, settings.load, run_dir, run_id, progress,
                                            observe=settings.observe)

Each call builds the experiment's plan (`quantload.load.plan`) for one served target and runs it
with `quantload.load.supervisor.run_plan`; it returns one `StageSummary` per stage. The target's
API key goes to the load processes through their environment, never into the plan.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

from quantload.config import LoadSettings, ObserveSettings
from quantload.load.plan import open_loop_plan, prefix_cache_plan, sweep_plan
from quantload.load.prompts import Prompt, select_prompts
from quantload.load.shared_prefix import build_system_prompt, erase_slots
from quantload.load.summary import StageSummary
from quantload.load.supervisor import LoadError, run_plan
from quantload.progress import ProgressCallback, no_progress
from quantload.served import ServedTarget

PREFIX_USER_MAX_TOKENS = 256  # the prompt-cache experiment's user turns stay short beside the prefix


def _prompts(settings: LoadSettings, prompts: Sequence[Prompt] | None) -> list[Prompt]:
    if prompts is not None:
        return list(prompts)
    return select_prompts(
        settings.prompts,
        settings.prompt_count,
        settings.min_prompt_tokens,
        settings.max_prompt_tokens,
        Path.cwd(),
    )


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
) -> list[StageSummary]:
    """Closed loop: the prompt set at each of `settings.users`, `settings.repeats` times."""
    plan = sweep_plan(
        settings, target, _prompts(settings, prompts), run_id, invocation_id("sweep", target)
    )
    return run_plan(plan, settings, run_dir, target.api_key_text, progress, observe=observe)


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
    return run_plan(plan, settings, run_dir, target.api_key_text, progress, observe=observe)


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
    return run_plan(plan, settings, run_dir, api_key, progress, observe=observe)
