"""The kv_types experiment: decode speed of one model file served with each KV-cache type.

    summaries = run_kv_types(servers, cache_types, settings.load, settings.kv_types, run_dir,
                             run_id, progress, observe=settings.observe)

For each cache type, `servers.serve(cache_type)` hands over a llama-server of the same file whose
K and V caches are of that type (the quantization's own server for the type it serves, a fresh one
otherwise) and one closed-loop stage runs on it: `kv_types.users` users, `kv_types.requests`
short prompts (at most `kv_types.prompt_max_tokens` tokens), each generating `kv_types.max_tokens`
tokens with ignore_eos and cache_prompt off, so every server does the same decode work and the
stages compare. Each stage line names its cache type (`kv_cache_type`).

A cache type whose server cannot be had (or whose stage cannot run) does not stop the others; the
experiment raises afterwards, naming each one that failed.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Final, Protocol

from quantload.config import KvTypeSettings, LoadSettings, ObserveSettings
from quantload.errors import ConfigError, QuantloadError
from quantload.load.plan import LoadPlan, PlannedRequest, StagePlan, request_params
from quantload.load.prompts import Prompt, select_prompts, warmup_prompt
from quantload.load.summary import StageSummary
from quantload.load.supervisor import LoadError, run_plan
from quantload.progress import ProgressCallback, no_progress
from quantload.served import ServedTarget

EXPERIMENT: Final = "kv_types"


class CacheTypeServers(Protocol):
    """Servers of one model file, one per KV-cache type (K and V the same type)."""

    def serve(self, cache_type: str) -> AbstractContextManager[ServedTarget]:
        """A started server whose K and V caches are `cache_type`, stopped (if it was started for
        this) when the context ends; QuantloadError when there is none."""
        ...


def short_prompts(settings: LoadSettings, kv: KvTypeSettings, cwd: Path | None = None) -> list[Prompt]:
    """`kv.requests` prompts of at most `kv.prompt_max_tokens` tokens, cycled when there are fewer."""
    try:
        found = select_prompts(settings.prompts, kv.requests, 1, kv.prompt_max_tokens, cwd or Path.cwd())
    except ConfigError as error:
        raise ConfigError(error.problem, "raise kv_types.prompt_max_tokens") from None
    return [found[index % len(found)] for index in range(kv.requests)]


def kv_type_plan(
    settings: LoadSettings,
    kv: KvTypeSettings,
    target: ServedTarget,
    prompts: Sequence[Prompt],
    run_id: str,
    invocation: str,
    cache_type: str,
) -> LoadPlan:
    """One closed-loop stage of decode-heavy requests on a server whose caches are `cache_type`."""
    warmup = warmup_prompt()
    stage = StagePlan(
        stage_id=f"{invocation}-0",
        index=0,
        experiment=EXPERIMENT,
        users=kv.users,
        cache_prompt=False,
        kv_cache_type=cache_type,
        warmup=tuple(PlannedRequest(prompt_id=warmup.id) for _ in range(settings.warmup_requests)),
        requests=tuple(PlannedRequest(prompt_id=prompt.id) for prompt in prompts),
        first_round_jitter_s=settings.first_round_jitter_s,
        timeout_s=settings.stage_timeout_s,
        server_state=f"KV cache K {cache_type}, V {cache_type}; cache_prompt off",
    )
    params = request_params(settings).model_copy(update={"max_tokens": kv.max_tokens, "ignore_eos": True})
    return LoadPlan(
        run_id=run_id,
        invocation=invocation,
        target=target,
        params=params,
        prompts={warmup.id: warmup.text, **{prompt.id: prompt.text for prompt in prompts}},
        stages=(stage,),
        max_consecutive_errors=settings.max_consecutive_errors,
        saturation_cpu_frac=settings.saturation_cpu_frac,
        saturation_lag_s=settings.saturation_lag_s,
    )


def _invocation(target: ServedTarget, cache_type: str, unique: str) -> str:
    label = "".join(c if c.isalnum() or c in "-_." else "_" for c in target.name)[:40]
    return f"{EXPERIMENT}-{label}-{cache_type}-{unique}"


def run_kv_types(
    servers: CacheTypeServers,
    cache_types: Sequence[str],
    settings: LoadSettings,
    kv: KvTypeSettings,
    run_dir: Path,
    run_id: str,
    progress: ProgressCallback = no_progress,
    *,
    observe: ObserveSettings | None = None,
    unique: str = "",
) -> list[StageSummary]:
    """One decode-heavy stage per cache type, each on its own server (see the module docstring)."""
    if kv.requests <= 0:
        return []
    prompts = short_prompts(settings, kv)
    tag = unique or uuid.uuid4().hex[:6]
    summaries: list[StageSummary] = []
    failed: list[str] = []
    for cache_type in cache_types:
        try:
            with servers.serve(cache_type) as target:
                plan = kv_type_plan(
                    settings, kv, target, prompts, run_id, _invocation(target, cache_type, tag), cache_type
                )
                summaries += run_plan(plan, settings, run_dir, target.api_key_text, progress, observe=observe)
        except QuantloadError as error:
            failed.append(f"{cache_type}: {error.one_line()}")
    if failed:
        raise LoadError(
            f"the kv_types experiment measured {len(cache_types) - len(failed)} of {len(cache_types)}"
            f" KV-cache types; {'; '.join(failed)}",
            "the stages it did run are in records.jsonl",
        )
    return summaries
