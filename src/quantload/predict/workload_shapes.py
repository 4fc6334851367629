"""The request shapes a prediction simulates: the same traffic the load would send, in tokens.

`workload.kind = lengths` gives them exactly (its input lengths count the whole prompt, chat
template included); `prompts` takes each prompt's token count from its set (counted or estimated
where the set has no counts) plus the chat template's tokens, and the plan's max_tokens as its
output: without ignore_eos a reply may end sooner, so the prediction is of the longest replies.
The other kinds (dataset, sessions, trace) are not predicted yet: a ConfigError says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from quantload.config import Settings
from quantload.errors import ConfigError
from quantload.load.lengths import parse_length_distribution
from quantload.load.prompts import select_prompts
from quantload.predict.simulator import RequestShape, SampledShapes

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
    raise ConfigError(
        f"workload.kind = {workload.kind} is not predicted yet",
        "predict with workload.kind = lengths (or prompts), the same token counts as your traffic",
    )
