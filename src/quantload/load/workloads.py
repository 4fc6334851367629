"""Workloads: what the requests of a stage are (their texts, lengths and labels), drawn as data.

A workload hands out `StageRequests` for a stage of `count` requests; the plan builders put them
into stages. The kinds (`workload.kind`):

  prompts    the prompt set (load.prompts), cycled when a stage asks for more than it holds
  lengths    synthetic prompts whose whole templated prompt has the drawn number of tokens
             (workload.input_lengths), each asking for the drawn output (workload.output_lengths)
  dataset    a ShareGPT/JSONL file's first user turns, each asking for the length of the reply
             the dataset gives it (or the line's own output_tokens)
  trace      a trace's input and output lengths, as synthetic prompts; in open loop its arrivals
  sessions   multi-turn conversations: synthetic user turns (sessions.turn_tokens) or a
             dataset's real ones, each reply asked for sessions.reply_tokens or the dataset's
             length, a think time before every later turn

Lengths are enforced: every workload but `prompts` sends `ignore_eos` with its `max_tokens`, so a
request's output is as long as asked whatever the model does, and records carry the asked
lengths (`max_tokens`, `prompt_tokens_asked`) beside the delivered ones (`completion_tokens`,
`prompt_tokens`). Prompts never exceed the server's slot context: a drawn input is clipped to
the context minus its output (said in a note). Each stage gets texts of its own (`tag`), so no
stage finds another's prompts in the server's cache.
"""

from __future__ import annotations

__all__ = [
    "DatasetWorkload", "LengthsWorkload", "PromptSetWorkload", "SessionWorkload", "StageRequests",
    "cycle_prompts",
]

import random
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from quantload.config import CONTEXT_MARGIN_TOKENS
from quantload.errors import ConfigError
from quantload.load.datasets import Conversation, Dataset
from quantload.load.lengths import LengthDistribution
from quantload.load.plan import PlannedRequest, PlannedTurn
from quantload.load.prompts import Prompt, estimate_tokens
from quantload.load.synthetic import PromptMaker
from quantload.load.trace import TraceRequest


@dataclass(frozen=True)
class StageRequests:
    """What one stage sends: its planned requests, the texts they name, and notes about them."""

    requests: tuple[PlannedRequest, ...]
    texts: dict[str, str]
    workload: str
    ignore_eos: bool | None = None
    template_overhead_tokens: int | None = None
    notes: tuple[str, ...] = field(default_factory=tuple)

    @classmethod
    def of_prompts(cls, prompts: Sequence[Prompt], workload: str = "prompts") -> StageRequests:
        """A stage of these prompts in order (one request each), as the prompt set sends them."""
        requests = tuple(PlannedRequest(prompt_id=p.id) for p in prompts)
        return cls(requests, {p.id: p.text for p in prompts}, workload)

    @property
    def tickets(self) -> int:
        """Requests to hand out (a conversation is one, whatever its turns)."""
        return len(self.requests)


class Workload(Protocol):
    """Draws the requests of a stage."""

    name: str

    def stage_requests(self, count: int, seed: int, tag: str) -> StageRequests: ...


def _index_base(tag: str) -> int:
    """A stable number per stage tag, so every stage's synthetic texts start elsewhere."""
    return zlib.crc32(tag.encode()) % 100_000 * 1000


@dataclass
class PromptSetWorkload:
    """The prompt set, cycled beyond its size (later rounds' ids end in #2, #3, ...)."""

    prompts: Sequence[Prompt]
    source: str = "builtin"
    name: str = "prompts"

    def stage_requests(self, count: int, seed: int, tag: str) -> StageRequests:
        if not self.prompts:
            raise ConfigError("the prompt set is empty", "check load.prompts")
        chosen = cycle_prompts(self.prompts, count)
        notes = () if count <= len(self.prompts) else (cycling_note(self.source, len(self.prompts), count),)
        return replace(StageRequests.of_prompts(chosen, self.name), notes=notes)


def cycle_prompts(prompts: Sequence[Prompt], count: int) -> list[Prompt]:
    """`count` prompts: the set in order, again and again; repeats get ids of their own."""
    chosen = []
    for index in range(count):
        prompt = prompts[index % len(prompts)]
        round_ = index // len(prompts) + 1
        chosen.append(
            prompt
            if round_ == 1
            else Prompt(f"{prompt.id}#{round_}", prompt.text, prompt.tokens, prompt.category)
        )
    return chosen


def cycling_note(source: str, available: int, count: int) -> str:
    """The one line that says a stage cycles its prompt set."""
    rounds = -(-count // available)
    return (
        f"{count} requests asked of the {available} prompts of {source} (within the length bounds):"
        f" the prompts are cycled, {rounds} rounds (repeats' ids end in #2, #3, ...); with"
        " cache_prompt on, a repeat may be served from the prompt cache"
    )


def _clip_note(clipped: int, first: str, context: int) -> str:
    return (
        f"{clipped} request(s) asked for more than the server's {context}-token slot context and"
        f" were shortened to fit (first: {first})"
    )


@dataclass
class LengthsWorkload:
    """Synthetic prompts of drawn lengths (see the module docstring)."""

    maker: PromptMaker
    input_lengths: LengthDistribution
    output_lengths: LengthDistribution
    context_tokens: int | None = None
    name: str = "lengths"

    def stage_requests(self, count: int, seed: int, tag: str) -> StageRequests:
        smallest = self.maker.smallest_prompt_tokens
        outputs = self.output_lengths.sample(count, seed + 1, minimum=1)
        inputs = self.input_lengths.sample(count, seed, minimum=smallest)
        return _synthetic(self.maker, inputs, outputs, tag, self.name, self.context_tokens)


def _synthetic(
    maker: PromptMaker,
    inputs: Sequence[int],
    outputs: Sequence[int],
    tag: str,
    name: str,
    context_tokens: int | None,
    offsets: Sequence[float | None] | None = None,
    labels: Sequence[str] | None = None,
) -> StageRequests:
    requests, texts, clipped = [], {}, []
    base = _index_base(tag)
    for i, (asked_in, asked_out) in enumerate(zip(inputs, outputs, strict=True)):
        prompt_tokens, max_tokens = asked_in, asked_out
        if context_tokens is not None:
            room = context_tokens - CONTEXT_MARGIN_TOKENS
            max_tokens = min(max_tokens, max(room - maker.smallest_prompt_tokens, 1))
            if prompt_tokens + max_tokens > room:
                clipped.append(labels[i] if labels else f"request {i}: {asked_in} + {asked_out} tokens")
                prompt_tokens = max(room - max_tokens, maker.smallest_prompt_tokens)
        prompt_tokens = max(prompt_tokens, maker.smallest_prompt_tokens)
        text, _ = maker.prompt(prompt_tokens, base + i)
        prompt_id = f"{tag}{i}"
        texts[prompt_id] = text
        requests.append(
            PlannedRequest(
                prompt_id=prompt_id,
                offset_s=offsets[i] if offsets is not None else None,
                max_tokens=max_tokens,
                prompt_tokens_asked=prompt_tokens,
            )
        )
    notes = (_clip_note(len(clipped), clipped[0], context_tokens),) if clipped and context_tokens else ()
    return StageRequests(tuple(requests), texts, name, True, maker.overhead_tokens, notes)


@dataclass
class TraceWorkload:
    """A trace's lengths as synthetic prompts; its arrivals when replayed open loop."""

    maker: PromptMaker
    trace: Sequence[TraceRequest]
    context_tokens: int | None = None
    path: str = ""
    name: str = "trace"

    def stage_requests(self, count: int, seed: int, tag: str, speed: float | None = None) -> StageRequests:
        """The first `count` requests of the trace (cycled), with their send offsets at `speed`."""
        chosen = [self.trace[i % len(self.trace)] for i in range(count)]
        offsets: list[float | None] | None = None
        if speed is not None:
            span = self.trace[-1].arrival_s if self.trace else 0.0
            offsets = [
                (request.arrival_s + (i // len(self.trace)) * (span + 1.0)) / speed
                for i, request in enumerate(chosen)
            ]
        return _synthetic(
            self.maker,
            [r.input_tokens for r in chosen],
            [r.output_tokens for r in chosen],
            tag,
            self.name,
            self.context_tokens,
            offsets,
            [f"{self.path}:{r.line}" for r in chosen],
        )

    @property
    def mean_rate_rps(self) -> float | None:
        """Requests per second over the trace's span; None for a trace of one instant."""
        span = self.trace[-1].arrival_s if self.trace else 0.0
        return (len(self.trace) - 1) / span if span > 0 else None


class Counter(Protocol):
    """Counts tokens of a text (the server's tokenizer, or an estimate)."""

    def __call__(self, text: str) -> int: ...


@dataclass
class DatasetWorkload:
    """A dataset's first user turns, each asking for its reply's length (see the module docstring)."""

    dataset: Dataset
    count_tokens: Counter = estimate_tokens
    overhead_tokens: int | None = None
    max_output_tokens: int = 1024
    output_fallback: LengthDistribution | None = None
    name: str = "dataset"

    def stage_requests(self, count: int, seed: int, tag: str) -> StageRequests:
        conversations = self.dataset.conversations
        fallback = (
            self.output_fallback.sample(count, seed, minimum=1) if self.output_fallback else [128] * count
        )
        requests, texts = [], {}
        for i in range(count):
            conversation = conversations[i % len(conversations)]
            first = conversation.turns[0]
            output = conversation.output_tokens
            if output is None and first.reply is not None:
                output = self.count_tokens(first.reply)
            output = min(max(output or fallback[i], 1), self.max_output_tokens)
            prompt_id = f"{tag}{conversation.id}" + (
                f"#{i // len(conversations) + 1}" if i >= len(conversations) else ""
            )
            texts[prompt_id] = first.user
            asked = (
                self.overhead_tokens + self.count_tokens(first.user)
                if self.overhead_tokens is not None
                else None
            )
            requests.append(PlannedRequest(prompt_id=prompt_id, max_tokens=output, prompt_tokens_asked=asked))
        notes = (
            []
            if count <= len(conversations)
            else [cycling_note(str(self.dataset.path), len(conversations), count)]
        )
        if self.dataset.skipped:
            notes.append(
                f"{self.dataset.skipped} entries of {self.dataset.path} have no user turn and were skipped"
            )
        return StageRequests(tuple(requests), texts, self.name, True, self.overhead_tokens, tuple(notes))


@dataclass
class SessionWorkload:
    """Multi-turn conversations, synthetic or from a dataset (see the module docstring)."""

    turns: int
    think_time_s: float
    reply_tokens: LengthDistribution
    maker: PromptMaker | None = None
    turn_tokens: LengthDistribution | None = None
    dataset: Dataset | None = None
    count_tokens: Counter = estimate_tokens
    max_output_tokens: int = 1024
    slots: int | None = None  # set: every turn of conversation i asks for slot i % slots
    context_tokens: int | None = None
    max_turn_tokens: int = 1_000_000  # a synthetic user turn's most tokens (a longer draw is clipped)
    warn_overflow: bool = True  # say when conversations may outgrow the slot (unless they are meant to)
    name: str = "sessions"

    def stage_requests(self, count: int, seed: int, tag: str) -> StageRequests:
        rng = random.Random(seed)
        requests: list[PlannedRequest] = []
        texts: dict[str, str] = {}
        base = _index_base(tag)
        longest = 0
        for i in range(count):
            session_id = f"{tag}s{i}"
            user_texts, counts, replies = self._turns(i, seed, base)
            think = [
                0.0 if k == 0 else round(self.think_time_s * rng.uniform(0.5, 1.5), 3)
                for k in range(len(user_texts))
            ]
            ids = [f"{session_id}t{k}" for k in range(len(user_texts))]
            texts.update(zip(ids, user_texts, strict=True))
            later = tuple(
                PlannedTurn(prompt_id=ids[k], max_tokens=replies[k], think_s=think[k])
                for k in range(1, len(user_texts))
            )
            longest = max(longest, sum(counts) + sum(replies))
            requests.append(
                PlannedRequest(
                    prompt_id=ids[0],
                    max_tokens=replies[0],
                    session_id=session_id,
                    id_slot=i % self.slots if self.slots else None,
                    later_turns=later,
                )
            )
        notes = []
        overhead = self.maker.overhead_tokens if self.maker is not None else 0
        if self.warn_overflow and self.context_tokens is not None and (
            longest + overhead + 8 * self.turns > self.context_tokens
        ):
            notes.append(
                f"the longest conversation reaches about {longest + overhead} tokens, near or beyond"
                f" the {self.context_tokens}-token slot context: its last turns may be refused"
                " (fewer sessions.turns or shorter turns fit)"
            )
        if self.dataset is not None and count > len(self.dataset.conversations):
            notes.append(cycling_note(str(self.dataset.path), len(self.dataset.conversations), count))
        return StageRequests(tuple(requests), texts, self.name, True, overhead or None, tuple(notes))

    def _turns(self, index: int, seed: int, base: int) -> tuple[list[str], list[int], list[int]]:
        """The user texts of conversation `index`, their tokens, and each reply's asked length."""
        if self.dataset is not None:
            conversation: Conversation = self.dataset.conversations[index % len(self.dataset.conversations)]
            chosen = conversation.turns[: self.turns]
            fallback = self.reply_tokens.sample(len(chosen), seed + index, minimum=1)
            replies = [
                min(self.count_tokens(turn.reply) if turn.reply else fallback[k], self.max_output_tokens)
                for k, turn in enumerate(chosen)
            ]
            users = [turn.user for turn in chosen]
            return users, [self.count_tokens(text) for text in users], [max(r, 1) for r in replies]
        assert self.maker is not None and self.turn_tokens is not None
        longest = self.max_turn_tokens
        lengths = self.turn_tokens.sample(self.turns, seed + 2 * index, minimum=1, maximum=longest)
        replies = self.reply_tokens.sample(self.turns, seed + 2 * index + 1, minimum=1)
        made = [self.maker.user_text(n, base + index * self.turns + k) for k, n in enumerate(lengths)]
        return (
            [text for text, _ in made],
            [count for _, count in made],
            [min(r, self.max_output_tokens) for r in replies],
        )
