"""The mixed experiment's stages: decode-heavy traffic alone, then with long prompts mixed in, at
each batch size, the server restarted with those flags where quantload started it (the experiment
as a whole: the package docstring)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import replace

from quantload.config import MixedSettings, Settings
from quantload.experiments.base import ExperimentContext, ExperimentRun, ServerFlags, experiment_run
from quantload.experiments.running import invocation_id, run_stages, workloads
from quantload.load.lengths import LengthDistribution
from quantload.load.plan import LoadPlan, PlannedRequest, StagePlan, assemble_plan, stage_plan
from quantload.load.summary import StageSummary
from quantload.load.workload_builder import WorkloadBuilder
from quantload.load.workloads import LengthsWorkload, StageRequests
from quantload.served import ServedTarget

NAME = "mixed"


def batch_args(pair: str) -> tuple[str, ...]:
    """llama-server flags of a "B/UB" batch-size pair."""
    logical, _, physical = pair.partition("/")
    return ("-b", logical, "-ub", physical)


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
    settings: Settings,
    target: ServedTarget,
    decode: StageRequests,
    long: StageRequests,
    server_args: str,
    run_id: str,
    invocation: str,
) -> LoadPlan:
    """Decode-heavy traffic alone, then the same with long prompts mixed in, at one batch size."""
    load, mixed = settings.load, settings.mixed
    decode_requests = tuple(r.model_copy(update={"request_class": "decode"}) for r in decode.requests)
    long_requests = tuple(r.model_copy(update={"request_class": "long_prompt"}) for r in long.requests)
    alone = replace(decode, requests=decode_requests)
    together = replace(decode, requests=tuple(interleave(decode_requests, long_requests)))
    stages: list[StagePlan] = []
    for repeat in range(mixed.repeats):
        for phase, drawn in (("alone", alone), ("mixed", together)):
            stages.append(
                stage_plan(
                    load, invocation, len(stages), NAME, mixed.users, drawn,
                    repeat=repeat, cache_prompt=False, phase=phase, server_args=server_args,
                )
            )
    return assemble_plan(load, target, run_id, invocation, [decode, long], stages)


def _fixed(builder: WorkloadBuilder, prompt_tokens: int, output_tokens: int) -> LengthsWorkload:
    fixed_in = LengthDistribution("fixed", low=prompt_tokens)
    fixed_out = LengthDistribution("fixed", low=output_tokens)
    return LengthsWorkload(builder.maker, fixed_in, fixed_out, builder.slots_and_context[1])


def _one_batch_size(
    context: ExperimentContext, target: ServedTarget, index: int, label: str
) -> list[StageSummary]:
    settings = context.settings
    mixed = settings.mixed
    invocation = invocation_id(NAME, target)
    with workloads(context, target) as builder:
        decode = _fixed(builder, mixed.decode_prompt_tokens, mixed.decode_output_tokens)
        long = _fixed(builder, mixed.long_prompt_tokens, mixed.long_output_tokens)
        seed = settings.load.seed + index
        decode_drawn = decode.stage_requests(mixed.decode_requests, seed, f"{invocation}-d")
        long_drawn = long.stage_requests(long_request_count(mixed), seed, f"{invocation}-l")
    plan = mixed_plan(settings, target, decode_drawn, long_drawn, label, context.run.run_id, invocation)
    return run_stages(context, plan).summaries


@contextlib.contextmanager
def _at_batch_size(context: ExperimentContext, pair: str) -> Iterator[ServedTarget]:
    assert context.servers is not None
    note = f"{context.target.name}: llama-server with -b/-ub {pair}"
    context.run.progress(0, None, note)
    flags = ServerFlags(extra_args=batch_args(pair), label=f"-b {pair.replace('/', ' -ub ')}")
    with context.servers.variant(flags) as variant:
        yield variant.target


def run(context: ExperimentContext) -> ExperimentRun:
    mixed = context.settings.mixed
    summaries: list[StageSummary] = []
    if context.servers is None:
        if len(mixed.batch_sizes) > 1:
            context.run.warn(
                "mixed: the server was not started by quantload, so it cannot be restarted at"
                f" {', '.join(mixed.batch_sizes)}; measured once at its own batch size"
            )
        summaries += _one_batch_size(context, context.target, 0, "server's own batch size")
        return experiment_run(NAME, summaries)
    for index, pair in enumerate(mixed.batch_sizes):
        with _at_batch_size(context, pair) as target:
            summaries += _one_batch_size(context, target, index, f"-b {pair.replace('/', ' -ub ')}")
    return experiment_run(NAME, summaries)
