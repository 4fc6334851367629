"""The messages a Locust master and its workers exchange to run a plan, as typed values.

Locust carries each message as a name and a msgpack-able `data`; every kind here knows its name
and how to go to and from that data, so neither side picks fields out of dicts by hand.

  worker -> master  TicketWant     a user of the worker is idle: send it the next ticket
  master -> worker  TicketReply    that ticket (None: there will be no more)
  worker -> master  TicketReturn   the user had stopped meanwhile: the ticket goes back
  worker -> master  RecordLine     one finished request (a records.jsonl line)
  worker -> master  HealthWindow   a quarter second of the worker's CPU time and loop lateness
  master -> worker  StageStarted   a stage's users are spawned: collect garbage now
  worker -> master  ClientFailed   quantload's own code raised in the worker: end the stage
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from quantload.load.tickets import Ticket


@dataclass(frozen=True)
class TicketWant:
    """A worker's user asks for a ticket; `want` numbers the request within the worker, `done`
    is the lane of the ticket it has just finished (a tenant's; None for none)."""

    NAME: ClassVar[str] = "ql_want"
    want: int
    done: str | None = None

    def to_data(self) -> dict[str, Any]:
        return {"want": self.want, "done": self.done}

    @classmethod
    def from_data(cls, data: Any) -> TicketWant:
        done = data.get("done")
        return cls(int(data["want"]), str(done) if done is not None else None)


@dataclass(frozen=True)
class TicketReply:
    """The master's answer to one `TicketWant`."""

    NAME: ClassVar[str] = "ql_ticket"
    want: int
    ticket: Ticket | None

    def to_data(self) -> dict[str, Any]:
        return {"want": self.want, "ticket": self.ticket.to_wire() if self.ticket is not None else None}

    @classmethod
    def from_data(cls, data: Any) -> TicketReply:
        wire = data["ticket"]
        return cls(int(data["want"]), Ticket.from_wire(wire) if wire is not None else None)


@dataclass(frozen=True)
class TicketReturn:
    """A ticket that reached a worker whose user had stopped."""

    NAME: ClassVar[str] = "ql_return"
    ticket: Ticket

    def to_data(self) -> dict[str, Any]:
        return {"ticket": self.ticket.to_wire()}

    @classmethod
    def from_data(cls, data: Any) -> TicketReturn:
        return cls(Ticket.from_wire(data["ticket"]))


@dataclass(frozen=True)
class RecordLine:
    """One request record, as the JSON line the master appends unchanged."""

    NAME: ClassVar[str] = "ql_record"
    line: str

    def to_data(self) -> dict[str, Any]:
        return {"line": self.line}

    @classmethod
    def from_data(cls, data: Any) -> RecordLine:
        return cls(str(data["line"]))


@dataclass(frozen=True)
class HealthWindow:
    """CPU seconds and event-loop lateness samples of one process over `wall_s` seconds."""

    NAME: ClassVar[str] = "ql_health"
    process: str
    cpu_s: float
    wall_s: float
    lags_s: tuple[float, ...]

    def to_data(self) -> dict[str, Any]:
        return {
            "process": self.process,
            "cpu_s": self.cpu_s,
            "wall_s": self.wall_s,
            "lags": list(self.lags_s),
        }

    @classmethod
    def from_data(cls, data: Any) -> HealthWindow:
        return cls(
            str(data["process"]), float(data["cpu_s"]), float(data["wall_s"]), tuple(data["lags"])
        )


@dataclass(frozen=True)
class StageStarted:
    """A stage's users are all spawned (its labels, STAGE_LABELS order)."""

    NAME: ClassVar[str] = "ql_stage"
    labels: tuple[str, ...]

    def to_data(self) -> dict[str, Any]:
        return {"labels": list(self.labels)}

    @classmethod
    def from_data(cls, data: Any) -> StageStarted:
        return cls(tuple(str(label) for label in data["labels"]))


@dataclass(frozen=True)
class ClientFailed:
    """An exception in a worker's own load code (not a server fault), as one line."""

    NAME: ClassVar[str] = "ql_client_failed"
    process: str
    cause: str

    def to_data(self) -> dict[str, Any]:
        return {"process": self.process, "cause": self.cause}

    @classmethod
    def from_data(cls, data: Any) -> ClientFailed:
        return cls(str(data["process"]), str(data["cause"]))
