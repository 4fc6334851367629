"""A deterministic discrete-event model of llama-server's scheduler (pinned build b11434).

The server loop it follows (reference/llama-cpp.md §9-10; server-context.cpp `update_slots`):

- `n_slots` slots (`--parallel`), each with `ctx_per_slot_tokens` of context. A request waits in
  one FIFO queue until a slot is free; it takes a slot at the start of the next server iteration
  (the server defers a task while every slot is busy and re-queues it when one is released).
  Free slots are filled in arrival order; prompts are then served in the order slots were taken
  (the server walks its slots by id and picks the least recently used free one, which for
  identical slots is the same order up to ties).
- Each iteration builds ONE batch (one llama_decode call): first one decode token for every slot
  that is generating, then prompt tokens of slots still processing their prompt until the batch
  holds `n_batch_tokens` (-b) tokens in all (§9: "each server step takes decode tokens first,
  then pending prompt tokens up to -b"); a longer prompt is split over iterations (chunked
  prefill). `-ub` splits a batch physically: that is part of the batch's cost, not of this model.
- The iteration lasts `cost.batch_s(prompt_tokens, decode_tokens, kv_tokens)`, `kv_tokens` being
  the tokens the batch's sequences already hold in the KV cache.
- A slot's first token comes at the end of the iteration that finishes its prompt; each later
  token costs one more iteration; the request ends with its `output_tokens`-th token, or earlier
  where prompt plus generated tokens reach the slot's context (context shift is off by default
  since PR 15416, §10: the server stops with "limit"). A prompt of at least the slot's context is
  refused at once (HTTP 400 `exceed_context_size_error`, §10): a failed request.
- `continuous_batching=False` (`-nocb`): prompt tokens join a batch only when no slot is
  generating (§10, server-context.cpp 3322: `if (cont_batching || batch.n_tokens == 0)`, and a
  batch holds decode tokens exactly when a slot generates). A request may hold a slot meanwhile;
  its wait counts as queueing. Several prompts may still share the batch that starts them all.
- `cached_prefix_tokens` (a prompt-cache hit) are already in the slot's KV cache and skip
  prefill; at least one prompt token is always evaluated (the server re-evaluates the last
  prompt token of a fully cached prompt to get its logits).

Closed-loop users are a real client's: each user's first request reaches the server up to
`ClientTiming.first_spread_s` after 0 (the load's `first_round_jitter_s`), and each later one
`turnaround_s` on average (drawn uniformly from 0 to twice that) after its previous reply ended:
the client's own time to read the reply and open the next request. Without it, users whose replies
end in the same iteration would send again at the same instant forever, their prompts always
sharing one batch; with any turnaround they drift apart as a real client's do, and a prompt lands
in a batch of the other slots' decode tokens (their TPOT then holds its prefill). Both default to
0, the hand-worked cases' synchronized users.

Time is simulated, never waited for. Randomness (request shapes, Poisson arrivals, exponential
think times) comes only from `numpy.random.Generator`s seeded by `seed`, so a run is a function of
its arguments. New requests stop at `max_requests` or `max_duration_s` (arrival time); the requests
sent by then all run to their end.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import numpy as np

from quantload.predict.batch_cost import BatchCost

ThinkTime = Literal["constant", "exponential"]


@dataclass(frozen=True)
class RequestShape:
    """One request's size: prompt tokens, tokens to generate (max_tokens), and how many of the
    prompt's first tokens the slot's prompt cache already holds."""

    prompt_tokens: int
    output_tokens: int
    cached_prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1 or self.cached_prefix_tokens < 0:
            raise ValueError(f"a request needs a prompt and an output token: {self}")


class ShapeSource(Protocol):
    """Where requests' shapes come from: `count` shapes drawn with `rng`."""

    def draw(self, rng: np.random.Generator, count: int) -> list[RequestShape]:
        """`count` request shapes."""
        ...


@dataclass(frozen=True)
class FixedShape:
    """Every request the same shape."""

    shape: RequestShape

    def draw(self, rng: np.random.Generator, count: int) -> list[RequestShape]:
        return [self.shape] * count


@dataclass(frozen=True)
class SampledShapes:
    """Shapes drawn uniformly with replacement from measured ones (a dataset's prompt/output pairs)."""

    shapes: tuple[RequestShape, ...]

    def __post_init__(self) -> None:
        if not self.shapes:
            raise ValueError("SampledShapes needs at least one shape")

    def draw(self, rng: np.random.Generator, count: int) -> list[RequestShape]:
        picks = rng.integers(0, len(self.shapes), size=count)
        return [self.shapes[int(index)] for index in picks]


@dataclass(frozen=True)
class ServerModel:
    """The server settings the scheduler depends on: --parallel, the context per slot
    (--ctx-size / --parallel), -b, and -cb/-nocb."""

    n_slots: int
    ctx_per_slot_tokens: int
    n_batch_tokens: int = 2048
    continuous_batching: bool = True

    def __post_init__(self) -> None:
        if self.n_slots < 1 or self.ctx_per_slot_tokens < 2 or self.n_batch_tokens < 1:
            raise ValueError(f"impossible server settings: {self}")


@dataclass(frozen=True)
class ClientTiming:
    """When a closed-loop client's requests reach the server: the first one of each user uniformly
    within `first_spread_s` of 0, each later one a uniform 0 to 2 x `turnaround_s` (plus the think
    time) after the previous reply ended."""

    first_spread_s: float = 0.0
    turnaround_s: float = 0.0

    def __post_init__(self) -> None:
        if self.first_spread_s < 0 or self.turnaround_s < 0:
            raise ValueError(f"a client's spread and turnaround are not negative: {self}")


LOCKSTEP = ClientTiming()  # users that all start at 0 and send again the instant a reply ends


@dataclass(frozen=True)
class ClosedLoop:
    """`users` users, starting at time 0 (or spread by `client`); each sends its next request
    `think_s` (constant, or exponential with that mean) after its previous one ended, plus the
    client's turnaround."""

    users: int
    shapes: ShapeSource
    max_requests: int = 1000
    max_duration_s: float = math.inf
    think_s: float = 0.0
    think: ThinkTime = "constant"
    client: ClientTiming = LOCKSTEP


@dataclass(frozen=True)
class OpenLoop:
    """Poisson arrivals at `rate_rps`, the first one exponential time after 0."""

    rate_rps: float
    shapes: ShapeSource
    max_requests: int = 1000
    max_duration_s: float = math.inf


@dataclass(frozen=True)
class TracedRequest:
    """A request sent at a given time (a trace, or a hand-worked case)."""

    arrival_s: float
    shape: RequestShape


@dataclass(frozen=True)
class Trace:
    """Requests at given times, in any order (ties keep their order)."""

    requests: tuple[TracedRequest, ...]


Workload = ClosedLoop | OpenLoop | Trace


@dataclass(frozen=True)
class RequestRecord:
    """One simulated request. Times are seconds from the start of the simulation.

    `start_s`: start of the first iteration holding its prompt tokens; `first_token_s`: end of the
    iteration that finished its prompt; `end_s`: its last token (or, failed, its refusal).
    """

    index: int
    user: int | None
    arrival_s: float
    prompt_tokens: int
    cached_prefix_tokens: int
    output_tokens: int
    start_s: float
    first_token_s: float
    end_s: float
    truncated: bool = False
    failed: bool = False

    @property
    def queue_s(self) -> float:
        """Arrival to the start of its first prompt iteration."""
        return self.start_s - self.arrival_s

    @property
    def prefill_s(self) -> float:
        """Start of its first prompt iteration to its first token."""
        return self.first_token_s - self.start_s

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s

    @property
    def tpot_s(self) -> float | None:
        """Mean time between its tokens after the first; None with one token."""
        if self.output_tokens < 2:
            return None
        return (self.end_s - self.first_token_s) / (self.output_tokens - 1)

    @property
    def decode_s(self) -> float:
        return self.end_s - self.first_token_s

    @property
    def e2e_s(self) -> float:
        return self.end_s - self.arrival_s


@dataclass(frozen=True)
class SimResult:
    """Every request of one simulation, in the order they were sent, and the server's iterations."""

    server: ServerModel
    records: tuple[RequestRecord, ...]
    iterations: int
    end_s: float

    @property
    def completed(self) -> tuple[RequestRecord, ...]:
        return tuple(record for record in self.records if not record.failed)

    @property
    def span_s(self) -> float:
        """First arrival to last end."""
        if not self.records:
            return 0.0
        return self.end_s - min(record.arrival_s for record in self.records)

    @property
    def throughput_rps(self) -> float:
        """Requests ended per second over the span."""
        span = self.span_s
        return len(self.records) / span if span > 0 else 0.0

    @property
    def mean_in_flight(self) -> float:
        """Time-average count of requests in the server (queued or in a slot) over the span."""
        span = self.span_s
        return sum(record.e2e_s for record in self.records) / span if span > 0 else 0.0


class _Slot:
    """A busy slot's request, mutable during one simulation only."""

    __slots__ = ("arrival_s", "cached", "first_s", "generated", "index", "kv_tokens",
                 "prompt", "prompt_left", "start_s", "target", "truncated", "user")  # fmt: skip

    def __init__(self, index: int, user: int | None, arrival_s: float, shape: RequestShape,
                 ctx_tokens: int) -> None:  # fmt: skip
        self.index = index
        self.user = user
        self.arrival_s = arrival_s
        self.prompt = shape.prompt_tokens
        self.cached = min(shape.cached_prefix_tokens, shape.prompt_tokens - 1)
        self.prompt_left = shape.prompt_tokens - self.cached
        self.kv_tokens = self.cached
        self.generated = 0
        room = ctx_tokens - shape.prompt_tokens
        self.target = min(shape.output_tokens, room)
        self.truncated = room < shape.output_tokens
        self.start_s = math.nan
        self.first_s = math.nan

    def record(self, end_s: float) -> RequestRecord:
        return RequestRecord(self.index, self.user, self.arrival_s, self.prompt, self.cached,
                             self.generated, self.start_s, self.first_s, end_s, self.truncated)  # fmt: skip


class _Arrivals:
    """Requests yet to arrive: a heap of (time, order, user, shape); closed-loop users add theirs
    as their previous request ends."""

    def __init__(self, workload: Workload, seed: int) -> None:
        self.heap: list[tuple[float, int, int | None, RequestShape]] = []
        self.sent = 0
        self.workload = workload
        self.user_rngs: list[np.random.Generator] = []
        self.user_shapes: list[list[RequestShape]] = []
        root = np.random.default_rng(seed)
        if isinstance(workload, Trace):
            for order, request in enumerate(workload.requests):
                self.heap.append((request.arrival_s, order, None, request.shape))
            heapq.heapify(self.heap)
            self.sent = len(workload.requests)
        elif isinstance(workload, OpenLoop):
            if workload.rate_rps <= 0:
                raise ValueError("an open loop needs a positive rate")
            count = workload.max_requests
            gaps = root.exponential(1.0 / workload.rate_rps, size=count)
            times = np.cumsum(gaps)
            count = int(np.searchsorted(times, workload.max_duration_s, side="right"))
            shapes = workload.shapes.draw(root, count)
            self.heap = [(float(times[i]), i, None, shapes[i]) for i in range(count)]
            self.sent = count
        else:
            if workload.users < 1 or workload.think_s < 0:
                raise ValueError("a closed loop needs a user and a non-negative think time")
            self.user_rngs = list(root.spawn(workload.users))
            self.user_shapes = [[] for _ in range(workload.users)]
            spread = workload.client.first_spread_s
            for user in range(min(workload.users, workload.max_requests)):
                first_s = float(self.user_rngs[user].uniform(0.0, spread)) if spread > 0 else 0.0
                self._send(user, first_s)

    def _send(self, user: int, time_s: float) -> None:
        shapes = self.user_shapes[user]
        if not shapes:
            assert isinstance(self.workload, ClosedLoop)
            shapes.extend(reversed(self.workload.shapes.draw(self.user_rngs[user], 32)))
        heapq.heappush(self.heap, (time_s, self.sent, user, shapes.pop()))
        self.sent += 1

    def ended(self, user: int | None, time_s: float) -> None:
        """A request of `user` ended at `time_s`: a closed-loop user sends its next one."""
        workload = self.workload
        if user is None or not isinstance(workload, ClosedLoop):
            return
        if self.sent >= workload.max_requests:
            return
        think = workload.think_s
        if think > 0 and workload.think == "exponential":
            think = float(self.user_rngs[user].exponential(think))
        turnaround = workload.client.turnaround_s
        if turnaround > 0:
            think += float(self.user_rngs[user].uniform(0.0, 2.0 * turnaround))
        if time_s + think <= workload.max_duration_s:
            self._send(user, time_s + think)


class _Scheduler:
    """One simulation's state: the queue, the slots prompting and generating, the clock."""

    def __init__(self, server: ServerModel, cost: BatchCost, workload: Workload, seed: int) -> None:
        self.server = server
        self.arrivals = _Arrivals(workload, seed)
        self.heap = self.arrivals.heap
        self.batch_s = cost.batch_s
        self.n_slots = server.n_slots
        self.n_batch = server.n_batch_tokens
        self.ctx = server.ctx_per_slot_tokens
        self.continuous = server.continuous_batching
        self.queue: deque[tuple[float, int, int | None, RequestShape]] = deque()
        self.prompting: list[_Slot] = []  # in the order they took their slot
        self.generating: list[_Slot] = []
        self.records: dict[int, RequestRecord] = {}
        self.now = 0.0
        self.iterations = 0

    def finish(self, slot: _Slot, end_s: float) -> None:
        self.records[slot.index] = slot.record(end_s)
        self.arrivals.ended(slot.user, end_s)

    def take_arrivals(self) -> None:
        """Every request arrived by now joins the queue."""
        heap, queue = self.heap, self.queue
        while heap and heap[0][0] <= self.now:
            queue.append(heapq.heappop(heap))

    def admit(self) -> None:
        """Queued requests take the free slots in order; a prompt that does not fit the slot's
        context is refused at once (exceed_context_size_error)."""
        self.take_arrivals()
        now = self.now
        while self.queue and len(self.prompting) + len(self.generating) < self.n_slots:
            arrival_s, index, user, shape = self.queue.popleft()
            if shape.prompt_tokens >= self.ctx:
                self.records[index] = RequestRecord(index, user, arrival_s, shape.prompt_tokens, 0, 0,
                                                    now, now, now, failed=True)  # fmt: skip
                self.arrivals.ended(user, now)
                self.take_arrivals()
                continue
            self.prompting.append(_Slot(index, user, arrival_s, shape, self.ctx))

    def prompt_iteration(self) -> None:
        """One batch of every generating slot's next token and as many prompt tokens as -b leaves
        room for, in the order the slots were taken."""
        generating = self.generating
        decode_tokens = len(generating)
        kv_tokens = 0
        for slot in generating:
            kv_tokens += slot.kv_tokens
        room = self.n_batch - decode_tokens
        chunks: list[tuple[_Slot, int]] = []
        for slot in self.prompting:
            take = min(slot.prompt_left, room)
            chunks.append((slot, take))
            kv_tokens += slot.kv_tokens
            room -= take
            if room == 0:
                break
        prompt_tokens = self.n_batch - decode_tokens - room
        start = self.now
        self.now += self.batch_s(prompt_tokens, decode_tokens, kv_tokens)
        now = self.now
        self.iterations += 1
        still: list[_Slot] = []
        for slot in generating:
            slot.generated += 1
            slot.kv_tokens += 1
            if slot.generated >= slot.target:
                self.finish(slot, now)
            else:
                still.append(slot)
        for slot, take in chunks:
            if slot.start_s != slot.start_s:  # NaN: its first prompt chunk
                slot.start_s = start
            slot.prompt_left -= take
            slot.kv_tokens += take
            if slot.prompt_left == 0:
                self.prompting.remove(slot)
                slot.first_s = now
                slot.generated = 1
                if slot.target <= 1:
                    self.finish(slot, now)
                else:
                    still.append(slot)
        self.generating = still

    def decode_run(self) -> None:
        """Only decode tokens until a slot ends (or, with a free slot and continuous batching, a
        request arrives): the same slots step together, their KV growing by one token each."""
        generating, batch_s = self.generating, self.batch_s
        decode_tokens = len(generating)
        steps = min(slot.target - slot.generated for slot in generating)
        can_admit = self.continuous and len(self.prompting) + decode_tokens < self.n_slots
        wake_s = self.heap[0][0] if self.heap and can_admit else math.inf
        kv_tokens = 0
        for slot in generating:
            kv_tokens += slot.kv_tokens
        now = self.now
        done = 0
        while done < steps:
            now += batch_s(0, decode_tokens, kv_tokens)
            kv_tokens += decode_tokens
            done += 1
            if now >= wake_s:
                break
        self.now = now
        self.iterations += done
        still = []
        for slot in generating:
            slot.generated += done
            slot.kv_tokens += done
            if slot.generated >= slot.target:
                self.finish(slot, now)
            else:
                still.append(slot)
        self.generating = still

    def run(self) -> SimResult:
        while True:
            self.admit()
            if not self.prompting and not self.generating:
                if not self.heap:
                    break
                self.now = max(self.now, self.heap[0][0])
                continue
            decode_tokens = len(self.generating)
            if self.prompting and (self.continuous or decode_tokens == 0) and decode_tokens < self.n_batch:
                self.prompt_iteration()
            else:
                self.decode_run()
        ordered = tuple(self.records[index] for index in sorted(self.records))
        return SimResult(self.server, ordered, self.iterations, self.now)


def simulate(server: ServerModel, cost: BatchCost, workload: Workload, seed: int = 0) -> SimResult:
    """Run `workload` through the scheduler of `server`, each batch costing `cost.batch_s`."""
    return _Scheduler(server, cost, workload, seed).run()


def trace(requests: Sequence[tuple[float, RequestShape]]) -> Trace:
    """A Trace of (arrival_s, shape) pairs."""
    return Trace(tuple(TracedRequest(arrival_s, shape) for arrival_s, shape in requests))
