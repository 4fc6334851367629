"""Tickets (one request to send), the book that hands them to waiting users, and stage bookkeeping.

The process that drives the stages fills a `TicketBook`; every user asks it for the next ticket and
is served in arrival order, at once if a ticket is there, else when one arrives. In a stage shared
by tenants a ticket of a tenant that already has as many requests in flight as it has users waits
(the next ticket that may go goes instead), and a user asking again says whose ticket it has just
finished (`Ticket.lane`), so each tenant keeps its own concurrency. The same book
serves local users (the waiter is a gevent result) and users on Locust workers (the waiter is a
worker id and request number; the ticket goes back as a message). Closing the book answers every
waiter with None. All of it is plain Python: no Locust, no gevent, no clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from typing import Any, Generic, TypeVar

import orjson

from quantload.load.plan import LoadPlan, RequestParams, StagePlan

W = TypeVar("W")


@dataclass(frozen=True)
class StageContext:
    """What a user needs to know about the stage a ticket belongs to (labels and parameters)."""

    run_id: str
    stage_id: str
    stage_index: int
    experiment: str
    users: int
    rate_rps: float | None
    repeat: int
    cache_prompt: bool
    server: str
    quant: str
    model: str
    url: str
    max_tokens: int
    temperature: float
    seed: int
    ignore_eos: bool
    request_timeout_s: float
    connect_timeout_s: float
    path: str
    reuse_connections: str
    first_round_jitter_s: float
    first_byte_timeout_s: float = 60.0
    extra_body: dict[str, Any] = field(default_factory=dict)
    workload: str | None = None
    tenant_users: dict[str, int] = field(default_factory=dict)  # each tenant's most in flight
    context_policy: str | None = None  # fail, trim or shift (the context experiment)
    slot_context_tokens: int | None = None

    @classmethod
    def of(cls, plan: LoadPlan, stage: StagePlan) -> StageContext:
        """The context of `stage` in `plan`."""
        params: RequestParams = plan.params
        return cls(
            run_id=plan.run_id,
            stage_id=stage.stage_id,
            stage_index=stage.index,
            experiment=stage.experiment,
            users=stage.users,
            rate_rps=stage.rate_rps,
            repeat=stage.repeat,
            cache_prompt=stage.cache_prompt,
            server=plan.target.name,
            quant=plan.target.quant,
            model=plan.target.model,
            url=plan.target.url,
            max_tokens=params.max_tokens,
            temperature=params.temperature,
            seed=params.seed,
            ignore_eos=params.ignore_eos if stage.ignore_eos is None else stage.ignore_eos,
            request_timeout_s=params.request_timeout_s,
            connect_timeout_s=params.connect_timeout_s,
            path=params.path,
            reuse_connections=params.reuse_connections,
            first_round_jitter_s=stage.first_round_jitter_s,
            first_byte_timeout_s=params.first_byte_timeout_s,
            extra_body=dict(params.extra_body),
            workload=stage.workload,
            tenant_users=stage.tenant_users,
            context_policy=stage.context_policy,
            slot_context_tokens=stage.slot_context_tokens,
        )

    def to_wire(self) -> dict[str, Any]:
        """The context as a msgpack-able dict (made once: every ticket of a stage sends it)."""
        return self._wire

    @cached_property
    def _wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> StageContext:
        return cls(**data)


@dataclass(frozen=True)
class TurnTicket:
    """A later turn of a conversation: the user text it adds, its output length, the pause before it."""

    prompt_id: str
    text: str
    max_tokens: int | None
    think_s: float

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> TurnTicket:
        return cls(str(data["prompt_id"]), str(data["text"]), data.get("max_tokens"), float(data["think_s"]))


@dataclass(frozen=True)
class Ticket:
    """One request to send: its stage, its prompt, and (open loop) when it is due.

    A workload may give the request its own output length and labels (see `PlannedRequest`); a
    conversation's ticket also carries the turns that follow (`later_turns`), which the user who
    takes it sends one after another (`next_turn`). Where the client trims the history
    (context policy trim), `history_tokens` holds each message's own tokens as the server
    counted them, and `trimmed_turns`/`trimmed_tokens` what the trim has left out so far.
    """

    stage: StageContext
    seq: int
    prompt_id: str
    messages: list[dict[str, str]]
    warmup: bool = False
    intended_unix_s: float | None = None
    max_tokens: int | None = None
    prompt_tokens_asked: int | None = None
    request_class: str | None = None
    session_id: str | None = None
    turn: int | None = None
    id_slot: int | None = None
    later_turns: tuple[TurnTicket, ...] = ()
    tenant: str | None = None
    ignore_eos: bool | None = None  # overrides the stage's
    history_tokens: tuple[int, ...] = ()
    trimmed_turns: int | None = None
    trimmed_tokens: int | None = None

    @property
    def lane(self) -> str | None:
        """Whose concurrency this ticket counts against: its stage phase and tenant (None: nobody's)."""
        if self.tenant is None:
            return None
        return f"{self.stage.stage_id}/{'w' if self.warmup else 'm'}/{self.tenant}"

    @property
    def sends_ignore_eos(self) -> bool:
        """Whether this request asks the server to ignore end-of-generation."""
        return self.stage.ignore_eos if self.ignore_eos is None else self.ignore_eos

    @property
    def asked_max_tokens(self) -> int:
        """The output length this request asks for."""
        return self.max_tokens if self.max_tokens is not None else self.stage.max_tokens

    @property
    def record_count(self) -> int:
        """Records this ticket yields: one per turn."""
        return 1 + len(self.later_turns)

    def body(self) -> bytes:
        """The JSON body of the streaming chat request."""
        stage = self.stage
        payload: dict[str, Any] = {
            "model": stage.model,
            "messages": self.messages,
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": self.asked_max_tokens,
            "temperature": stage.temperature,
            "seed": stage.seed,
            "cache_prompt": stage.cache_prompt,
        }
        if self.sends_ignore_eos:
            payload["ignore_eos"] = True
        if self.id_slot is not None:
            payload["id_slot"] = self.id_slot
        payload.update(stage.extra_body)
        return orjson.dumps(payload)

    def next_turn(self, reply: str, counted: tuple[int, int] | None = None) -> Ticket:
        """The conversation's next turn: the history, the server's actual `reply`, the next user
        text; `counted` is the tokens of those two where the history is counted (trim)."""
        following = self.later_turns[0]
        messages = [
            *self.messages,
            {"role": "assistant", "content": reply},
            {"role": "user", "content": following.text},
        ]
        counts = (*self.history_tokens, *counted) if counted is not None and self.history_tokens else ()
        return Ticket(
            stage=self.stage,
            seq=self.seq,
            prompt_id=following.prompt_id,
            messages=messages,
            warmup=self.warmup,
            intended_unix_s=None,
            max_tokens=following.max_tokens,
            request_class=self.request_class,
            session_id=self.session_id,
            turn=(self.turn or 0) + 1,
            id_slot=self.id_slot,
            later_turns=self.later_turns[1:],
            tenant=self.tenant,
            ignore_eos=self.ignore_eos,
            history_tokens=counts,
            trimmed_turns=self.trimmed_turns,
            trimmed_tokens=self.trimmed_tokens,
        )

    def to_wire(self) -> dict[str, Any]:
        return {
            "stage": self.stage.to_wire(),
            "seq": self.seq,
            "prompt_id": self.prompt_id,
            "messages": self.messages,
            "warmup": self.warmup,
            "intended_unix_s": self.intended_unix_s,
            "max_tokens": self.max_tokens,
            "prompt_tokens_asked": self.prompt_tokens_asked,
            "request_class": self.request_class,
            "session_id": self.session_id,
            "turn": self.turn,
            "id_slot": self.id_slot,
            "later_turns": [turn.to_wire() for turn in self.later_turns],
            "tenant": self.tenant,
            "ignore_eos": self.ignore_eos,
            "history_tokens": list(self.history_tokens),
            "trimmed_turns": self.trimmed_turns,
            "trimmed_tokens": self.trimmed_tokens,
        }

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Ticket:
        return cls(
            stage=StageContext.from_wire(data["stage"]),
            seq=int(data["seq"]),
            prompt_id=str(data["prompt_id"]),
            messages=list(data["messages"]),
            warmup=bool(data["warmup"]),
            intended_unix_s=data.get("intended_unix_s"),
            max_tokens=data.get("max_tokens"),
            prompt_tokens_asked=data.get("prompt_tokens_asked"),
            request_class=data.get("request_class"),
            session_id=data.get("session_id"),
            turn=data.get("turn"),
            id_slot=data.get("id_slot"),
            later_turns=tuple(TurnTicket.from_wire(t) for t in data.get("later_turns") or ()),
            tenant=data.get("tenant"),
            ignore_eos=data.get("ignore_eos"),
            history_tokens=tuple(int(n) for n in data.get("history_tokens") or ()),
            trimmed_turns=data.get("trimmed_turns"),
            trimmed_tokens=data.get("trimmed_tokens"),
        )


def stage_tickets(
    plan: LoadPlan, stage: StagePlan, warmup: bool, start_unix_s: float | None = None
) -> list[Ticket]:
    """The tickets of one phase of a stage; open-loop offsets become absolute intended times."""
    context = StageContext.of(plan, stage)
    system = plan.prompts.get(stage.system_prompt_id) if stage.system_prompt_id else None
    planned = stage.warmup if warmup else stage.requests
    tickets = []
    for seq, request in enumerate(planned):
        messages = [{"role": "system", "content": system}] if system else []
        messages.append({"role": "user", "content": plan.prompts[request.prompt_id]})
        intended = None
        if request.offset_s is not None and start_unix_s is not None and not warmup:
            intended = start_unix_s + request.offset_s
        turns = tuple(
            TurnTicket(turn.prompt_id, plan.prompts[turn.prompt_id], turn.max_tokens, turn.think_s)
            for turn in request.later_turns
        )
        tickets.append(
            Ticket(
                context,
                seq,
                request.prompt_id,
                messages,
                warmup,
                intended,
                max_tokens=request.max_tokens,
                prompt_tokens_asked=request.prompt_tokens_asked,
                request_class=request.request_class,
                session_id=request.session_id,
                turn=0 if request.session_id is not None else None,
                id_slot=request.id_slot,
                later_turns=turns,
                tenant=request.tenant,
                ignore_eos=request.ignore_eos,
                trimmed_turns=0 if stage.context_policy == "trim" and turns else None,
                trimmed_tokens=0 if stage.context_policy == "trim" and turns else None,
            )
        )
    return tickets


class TicketBook(Generic[W]):
    """Tickets waiting for users and users waiting for tickets, both first come first served."""

    def __init__(self, deliver: Callable[[W, Ticket | None], None]) -> None:
        self._deliver = deliver
        self._tickets: deque[Ticket] = deque()
        self._waiters: deque[W] = deque()
        self._busy: dict[str, int] = {}  # tickets in flight per lane (a stage phase's tenant)
        self.closed = False
        self.handed_out = 0
        self.handed_records = 0  # records the handed-out tickets yield (one per turn)

    @property
    def pending(self) -> int:
        """Tickets not yet handed to a user."""
        return len(self._tickets)

    @property
    def waiting(self) -> int:
        """Users waiting for a ticket."""
        return len(self._waiters)

    def in_flight(self, lane: str) -> int:
        """Tickets of `lane` handed out and not yet finished."""
        return self._busy.get(lane, 0)

    def want(self, waiter: W, done: str | None = None) -> None:
        """A user asks for its next ticket, having finished one of lane `done` (None: none, or
        one of no tenant); it is delivered now or when one may go."""
        if done is not None:
            self._release(done)
        if self._waiters and not self.closed:  # users who waited longer go first
            self._waiters.append(waiter)
            self._serve()
            return
        ticket = self._take_next()
        if ticket is not None:
            self._deliver(waiter, ticket)
        elif self.closed:
            self._deliver(waiter, None)
        else:
            self._waiters.append(waiter)

    def withdraw(self, waiter: W) -> bool:
        """Forget a waiter that stopped (a user being stopped); True if it was waiting."""
        try:
            self._waiters.remove(waiter)
        except ValueError:
            return False
        return True

    def add(self, tickets: Iterable[Ticket]) -> None:
        """Queue tickets, serving waiting users first."""
        self._tickets.extend(tickets)
        self._serve()

    def put_back(self, ticket: Ticket) -> None:
        """A ticket that reached a user who had gone: it goes to the front again."""
        self._count_out(ticket, -1)
        if ticket.lane is not None:
            self._release(ticket.lane)
        self._tickets.appendleft(ticket)
        self._serve()

    def cancel_pending(self) -> int:
        """Drop every ticket not yet handed out; return how many."""
        dropped = len(self._tickets)
        self._tickets.clear()
        return dropped

    def close(self) -> None:
        """No more tickets: answer every waiter (now and later) with None."""
        self.closed = True
        self._tickets.clear()
        while self._waiters:
            self._deliver(self._waiters.popleft(), None)

    def _serve(self) -> None:
        while self._tickets and self._waiters:
            ticket = self._take_next()
            if ticket is None:  # every ticket left waits for its tenant's requests in flight
                return
            self._deliver(self._waiters.popleft(), ticket)

    def _may_go(self, ticket: Ticket) -> bool:
        lane = ticket.lane
        if lane is None:
            return True
        limit = ticket.stage.tenant_users.get(ticket.tenant or "")
        return limit is None or self._busy.get(lane, 0) < limit

    def _take_next(self) -> Ticket | None:
        """The first ticket that may go now (counted out), or None."""
        tickets = self._tickets
        if not tickets:
            return None
        index = 0
        if tickets[0].lane is not None:
            index = next((i for i, ticket in enumerate(tickets) if self._may_go(ticket)), -1)
            if index < 0:
                return None
        ticket = tickets[index]
        del tickets[index]
        self._count_out(ticket, 1)
        if ticket.lane is not None:
            self._busy[ticket.lane] = self._busy.get(ticket.lane, 0) + 1
        return ticket

    def _release(self, lane: str) -> None:
        left = self._busy.get(lane, 0) - 1
        if left > 0:
            self._busy[lane] = left
        else:
            self._busy.pop(lane, None)

    def _count_out(self, ticket: Ticket, sign: int) -> None:
        self.handed_out += sign
        self.handed_records += sign * ticket.record_count


@dataclass
class StageTracker:
    """Counts the records of one stage phase and trips after too many failures in a row."""

    stage_id: str
    planned: int
    warmup: bool
    max_consecutive_errors: int
    ignored: tuple[str, ...] = ()  # error classes the stage expects: they never trip it
    done: int = 0
    ok: int = 0
    consecutive_errors: int = 0
    last_error: str | None = None
    tripped: bool = False

    @property
    def finished(self) -> bool:
        return self.done >= self.planned

    def observe(self, stage_id: str, warmup: bool, ok: bool, error: str | None) -> bool:
        """Count one record; False when it belongs to another stage or phase."""
        if stage_id != self.stage_id or warmup != self.warmup:
            return False
        self.done += 1
        if ok:
            self.ok += 1
            self.consecutive_errors = 0
        elif error in self.ignored:  # expected (a conversation outgrowing its slot): not counted
            self.last_error = error
        else:
            self.consecutive_errors += 1
            self.last_error = error
            if self.consecutive_errors >= self.max_consecutive_errors:
                self.tripped = True
        return True
