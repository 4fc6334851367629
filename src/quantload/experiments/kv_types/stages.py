"""The kv_types experiment's stages: one decode-heavy closed-loop stage per KV-cache type, each on
a server whose caches are of that type, run through the load supervisor (the experiment as a whole:
the package docstring)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from quantload.config import Settings
from quantload.errors import ConfigError, QuantloadError
from quantload.experiments.base import (
    ExperimentContext,
    ExperimentRun,
    ServerFlags,
    experiment_run,
)
from quantload.experiments.running import invocation_id, run_stages
from quantload.kvcheck import merge_kv_cache_type
from quantload.load.plan import LoadPlan, PlannedRequest, assemble_plan, stage_plan
from quantload.load.prompts import select_prompts
from quantload.load.summary import StageSummary
from quantload.load.supervisor import LoadError
from quantload.load.workloads import StageRequests
from quantload.served import ServedTarget

NAME = "kv_types"


def missing(settings: Settings) -> str | None:
    if settings.kv_types.requests <= 0:
        return "kv_types.requests is 0"
    if len(settings.quality.kld_cache_types) < 2:
        return "quality.kld_cache_types names fewer than two cache types"
    return None


def decode_requests(settings: Settings, cwd: Path) -> StageRequests:
    """`kv_types.requests` prompts of load.prompts of at most `kv_types.prompt_max_tokens` tokens
    (cycled when fewer), each asking for `kv_types.max_tokens` with ignore_eos."""
    kv = settings.kv_types
    try:
        short = select_prompts(settings.load.prompts, kv.requests, 1, kv.prompt_max_tokens, cwd)
    except ConfigError as error:
        raise ConfigError(error.problem, "raise kv_types.prompt_max_tokens") from None
    chosen = [short[index % len(short)] for index in range(kv.requests)]
    return StageRequests(
        tuple(PlannedRequest(prompt_id=p.id, max_tokens=kv.max_tokens) for p in chosen),
        {p.id: p.text for p in chosen},
        "prompts",
        ignore_eos=True,
    )


def kv_type_plan(
    settings: Settings,
    target: ServedTarget,
    drawn: StageRequests,
    run_id: str,
    invocation: str,
    cache_type: str,
) -> LoadPlan:
    """One closed-loop stage of decode-heavy requests on a server whose caches are `cache_type`."""
    load = settings.load
    stage = stage_plan(
        load, invocation, 0, NAME, settings.kv_types.users, drawn,
        cache_prompt=False, kv_cache_type=cache_type,
        server_state=f"KV cache K {cache_type}, V {cache_type}; cache_prompt off",
    )  # fmt: skip
    return assemble_plan(load, target, run_id, invocation, [drawn], [stage])


@contextlib.contextmanager
def _served_with(context: ExperimentContext, cache_type: str) -> Iterator[ServedTarget]:
    server = context.settings.server
    if server.cache_type_k == server.cache_type_v == cache_type:
        yield context.target
        return
    if context.servers is None:
        raise ConfigError(
            "the kv_types experiment starts llama-servers of its own", "run it through `quantload run`"
        )
    flags = ServerFlags(cache_type=cache_type, label=f"kv-{cache_type}")
    with context.servers.variant(flags) as variant:
        kv_json = context.run.run_dir.kv_path
        merge_kv_cache_type(kv_json, context.target.quant, cache_type, variant.kv or variant.kv_error or "")
        yield variant.target


def run(context: ExperimentContext) -> ExperimentRun:
    settings = context.settings
    drawn = decode_requests(settings, context.run.cwd)
    types = settings.quality.kld_cache_types
    summaries: list[StageSummary] = []
    failed: list[str] = []
    for cache_type in types:
        try:
            with _served_with(context, cache_type) as target:
                invocation = f"{invocation_id(NAME, target)}-{cache_type}"
                plan = kv_type_plan(settings, target, drawn, context.run.run_id, invocation, cache_type)
                summaries += run_stages(context, plan).summaries
        except QuantloadError as error:
            failed.append(f"{cache_type}: {error.one_line()}")
    if failed:
        raise LoadError(
            f"the kv_types experiment measured {len(types) - len(failed)} of {len(types)}"
            f" KV-cache types; {'; '.join(failed)}",
            "the stages it did run are in records.jsonl",
        )
    return experiment_run(NAME, summaries)

