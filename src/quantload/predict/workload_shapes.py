"""The request shapes a prediction simulates: the same traffic the load would send, in tokens.

`workload.kind = lengths` gives them exactly (its input lengths count the whole prompt, chat
template included); `prompts` takes each prompt's token count from its set (counted or estimated
where the set has no counts) plus the chat template's tokens, and the plan's max_tokens as its
output: without ignore_eos a reply may end sooner, so the prediction is of the longest replies.
`dataset` plans its requests as the load does (quantload.load.workloads.DatasetWorkload: each
entry's first user turn, asking for its reply's length, capped by workload.max_output_tokens), with
the turn's tokens estimated without a tokenizer (about four characters a token) plus the chat
template's. The other kinds (sessions, trace) are not predicted yet: a ConfigError says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quantload.config import Settings
from quantload.errors import ConfigError
from quantload.load.lengths import parse_length_distribution
from quantload.load.prompts import estimate_tokens, select_prompts
from quantload.load.workload_builder import read_named_dataset
from quantload.load.workloads import DatasetWorkload
from quantload.predict.simulator import RequestShape, SampledShapes

DATASET_REQUESTS = 4000  # a dataset's requests planned once (it cycles past its end, as the load does)
PROMPT_SET_ALL = 1_000_000  # every prompt of the set within its length bounds
LENGTH_SAMPLES = 4000  # shapes drawn once from a length distribution; the simulation draws from these
TEMPLATE_TOKENS = 30  # a chat template's tokens around one user turn (ChatML with a system line)


@dataclass(frozen=True)
class WorkloadShapes:
    """What a level sends, as the simulation draws it, and what the prediction assumed of it."""

    shapes: SampledShapes
    source: str  # e.g. "lengths: lognormal:mean=300,spread=0.6 -> fixed:128"
    notes: tuple[str, ...] = ()

    @property
    def mean_prompt_tokens(self) -> float:
        return sum(shape.prompt_tokens for shape in self.shapes.shapes) / len(self.shapes.shapes)

    @property
    def mean_output_tokens(self) -> float:
        return sum(shape.output_tokens for shape in self.shapes.shapes) / len(self.shapes.shapes)


def _fit(prompt_tokens: int, output_tokens: int, ctx_per_slot: int) -> RequestShape:
    """A request clipped as the load clips it to the slot's context (the output first)."""
    output = max(1, min(output_tokens, ctx_per_slot - 2))
    prompt = max(1, min(prompt_tokens, ctx_per_slot - output - 1))
    return RequestShape(prompt, output)


def workload_shapes(
    settings: Settings, cwd: Path | None = None, template_tokens: int = TEMPLATE_TOKENS
) -> WorkloadShapes:
    """The shapes of `settings`' workload; ConfigError for a kind not predicted."""
    workload, load = settings.workload, settings.load
    ctx = settings.server.ctx_per_slot
    if workload.kind == "lengths":
        inputs = parse_length_distribution(workload.input_lengths)
        outputs = parse_length_distribution(workload.output_lengths)
        prompt_tokens = inputs.sample(LENGTH_SAMPLES, load.seed)
        output_tokens = outputs.sample(LENGTH_SAMPLES, load.seed + 1)
        shapes = tuple(_fit(p, o, ctx) for p, o in zip(prompt_tokens, output_tokens, strict=True))
        source = f"lengths: {inputs.text()} -> {outputs.text()}"
        return WorkloadShapes(SampledShapes(shapes), source)
    if workload.kind == "prompts":
        prompts = select_prompts(
            load.prompts, PROMPT_SET_ALL, load.min_prompt_tokens, load.max_prompt_tokens, cwd
        )
        shapes = tuple(_fit(prompt.tokens + template_tokens, load.max_tokens, ctx) for prompt in prompts)
        notes = [f"each prompt counted with {template_tokens} tokens of chat template"]
        if not load.ignore_eos:
            notes.append(
                f"outputs taken at max_tokens ({load.max_tokens}): without ignore_eos a reply may end"
                " sooner, so this predicts the longest replies"
            )
        source = f"prompts: {load.prompts} ({len(shapes)} prompts) -> max_tokens {load.max_tokens}"
        return WorkloadShapes(SampledShapes(shapes), source, tuple(notes))
    if workload.kind == "dataset":
        return dataset_shapes(settings, cwd, template_tokens)
    raise ConfigError(
        f"workload.kind = {workload.kind} is not predicted yet",
        "predict with workload.kind = lengths, prompts or dataset, the same token counts as your traffic",
    )


def dataset_shapes(settings: Settings, cwd: Path | None, template_tokens: int) -> WorkloadShapes:
    """workload.dataset's requests as the load plans them, in tokens."""
    workload = settings.workload
    dataset = read_named_dataset(workload.dataset, "workload.dataset", cwd or Path.cwd())
    planned = DatasetWorkload(
        dataset, estimate_tokens, template_tokens, workload.max_output_tokens,
        parse_length_distribution(workload.output_lengths),
    ).stage_requests(DATASET_REQUESTS, settings.load.seed, "")  # fmt: skip
    ctx = settings.server.ctx_per_slot
    shapes = tuple(
        _fit(
            request.prompt_tokens_asked or template_tokens + 1,
            request.max_tokens or settings.load.max_tokens,
            ctx,
        )
        for request in planned.requests
    )
    notes = [
        f"each first user turn's tokens estimated at about four characters a token, with {template_tokens}"
        " tokens of chat template",
        *planned.notes,
    ]
    source = f"dataset: {workload.dataset} ({len(dataset.conversations)} conversations)"
    return WorkloadShapes(SampledShapes(shapes), source, tuple(notes))
