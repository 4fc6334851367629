"""The client's history trim: a conversation that outgrows the slot keeps its system prompt and
the most recent turns that fit, counted with the server's own tokenizer.

Before each later turn of a stage whose context policy is `trim`, the history the turn would send
(system prompt, every earlier user turn and reply, the new user turn) must leave room for the
turn's reply: `slot context - max_tokens - CONTEXT_MARGIN_TOKENS` tokens of whole templated
prompt. Each message's own tokens are counted once with llama-server's `/tokenize` (a reply's are
the `completion_tokens` the server reported), and what the chat template adds is measured once
per server (`TemplateCost`: the tokens around one message and around the whole prompt), so the
history's length is known without asking the server each turn. When it would not fit, the
earliest (user, reply) pairs after the system prompt are left out until it does, and the trimmed
history is counted as the server will build it (`/apply-template` then `/tokenize`), dropping one
more pair while it is still over. The window only moves forward: a turn left out stays out.

What the trim left out is carried by the ticket (`trimmed_turns`, `trimmed_tokens`) and written
in every record of the conversation from then on.
"""

from __future__ import annotations

__all__ = ["whole_prompt_tokens"]

from collections.abc import Sequence
from dataclasses import dataclass, replace

from quantload.config import CONTEXT_MARGIN_TOKENS
from quantload.load.synthetic import Tokenizer
from quantload.load.tickets import Ticket

PROBE_SYSTEM = "You are a helpful assistant."
PROBE_TEXT = "Hello there, how are you today?"
CLOSE_TOKENS = 16  # an estimate this near the budget is counted exactly before it is trusted
MAX_EXACT_COUNTS = 4


@dataclass(frozen=True)
class TemplateCost:
    """What the chat template adds: tokens around each message, and around the whole prompt."""

    per_message_tokens: int
    base_tokens: int

    def estimate(self, message_tokens: Sequence[int]) -> int:
        """Whole-prompt tokens of messages whose own tokens are `message_tokens`."""
        return self.base_tokens + sum(count + self.per_message_tokens for count in message_tokens)


def whole_prompt_tokens(tokenizer: Tokenizer, messages: list[dict[str, str]]) -> int:
    """Tokens of the whole prompt the server builds from `messages` (special tokens included)."""
    return len(tokenizer.tokenize(tokenizer.apply_template(messages), add_special=True))


def measure_template(tokenizer: Tokenizer) -> TemplateCost:
    """The template's cost, from a system prompt and one, then three, messages after it."""
    system = {"role": "system", "content": PROBE_SYSTEM}
    one = [system, {"role": "user", "content": PROBE_TEXT}]
    three = [*one, {"role": "assistant", "content": PROBE_TEXT}, {"role": "user", "content": PROBE_TEXT}]
    text_tokens = len(tokenizer.tokenize(PROBE_TEXT))
    system_tokens = len(tokenizer.tokenize(PROBE_SYSTEM))
    short, long = whole_prompt_tokens(tokenizer, one), whole_prompt_tokens(tokenizer, three)
    per_message = max((long - short) // 2 - text_tokens, 0)
    base = max(short - system_tokens - text_tokens - 2 * per_message, 0)
    return TemplateCost(per_message, base)


@dataclass(frozen=True)
class TrimOutcome:
    """The turn as it will be sent, and what the server will count of its prompt (None: estimated)."""

    ticket: Ticket
    prompt_tokens_counted: int | None


def history_budget_tokens(slot_context_tokens: int, max_tokens: int) -> int:
    """The whole-prompt tokens a turn may send and still have room for its reply."""
    return slot_context_tokens - max_tokens - CONTEXT_MARGIN_TOKENS


def _dropped(
    messages: list[dict[str, str]], counts: Sequence[int], pairs: int, first: int
) -> tuple[list[dict[str, str]], list[int]]:
    """The messages with `pairs` (user, reply) pairs left out after the first `first` messages."""
    cut = first + 2 * pairs
    return [*messages[:first], *messages[cut:]], [*counts[:first], *counts[cut:]]


class HistoryTrimmer:
    """Trims one server's conversations (see the module docstring)."""

    def __init__(self, tokenizer: Tokenizer, cost: TemplateCost | None = None) -> None:
        self.tokenizer = tokenizer
        self._cost = cost

    @property
    def cost(self) -> TemplateCost:
        if self._cost is None:
            self._cost = measure_template(self.tokenizer)
        return self._cost

    def count_messages(self, messages: Sequence[dict[str, str]]) -> tuple[int, ...]:
        """Each message's own tokens by the server's tokenizer."""
        return tuple(len(self.tokenizer.tokenize(m["content"])) for m in messages)

    def next_turn(self, ticket: Ticket, reply: str, reply_tokens: int | None) -> Ticket:
        """The conversation's next turn, its history counted (the new user turn by the server's
        tokenizer, the reply by the server's own count when it gave one)."""
        counts = ticket.history_tokens or self.count_messages(ticket.messages)
        following = ticket.later_turns[0]
        reply_count = reply_tokens if reply_tokens is not None else len(self.tokenizer.tokenize(reply))
        user_count = len(self.tokenizer.tokenize(following.text))
        counted = replace(ticket, history_tokens=tuple(counts))
        return counted.next_turn(reply, (reply_count, user_count))

    def fit(self, ticket: Ticket, budget_tokens: int) -> TrimOutcome:
        """`ticket` with the earliest turns of its history left out until it fits `budget_tokens`.

        The system prompt (a first message of role system) and the newest user turn always stay;
        when even they do not fit, the ticket goes as it is and the server decides (a refusal is
        recorded as such).
        """
        messages = list(ticket.messages)
        counts = list(ticket.history_tokens or self.count_messages(messages))
        first = 1 if messages and messages[0].get("role") == "system" else 0
        cost = self.cost
        pairs_available = (len(messages) - first - 1) // 2
        pairs = 0
        while pairs < pairs_available:
            if cost.estimate(_dropped(messages, counts, pairs, first)[1]) <= budget_tokens:
                break
            pairs += 1
        kept, kept_counts = _dropped(messages, counts, pairs, first)
        counted: int | None = None
        if pairs > 0 or cost.estimate(kept_counts) > budget_tokens - CLOSE_TOKENS:
            for _ in range(MAX_EXACT_COUNTS):
                counted = whole_prompt_tokens(self.tokenizer, kept)
                if counted <= budget_tokens or pairs >= pairs_available:
                    break
                pairs += 1
                kept, kept_counts = _dropped(messages, counts, pairs, first)
        if pairs == 0:
            return TrimOutcome(replace(ticket, history_tokens=tuple(counts)), counted)
        left_out = counts[first : first + 2 * pairs]
        trimmed = replace(
            ticket,
            messages=kept,
            history_tokens=tuple(kept_counts),
            trimmed_turns=(ticket.trimmed_turns or 0) + pairs,
            trimmed_tokens=(ticket.trimmed_tokens or 0)
            + sum(left_out)
            + cost.per_message_tokens * len(left_out),
        )
        return TrimOutcome(trimmed, counted)
