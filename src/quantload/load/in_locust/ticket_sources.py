"""Where a user gets its next request: the process's own ticket book, or the master's by message."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

import gevent
from gevent.event import AsyncResult

from quantload.load.in_locust.messages import TicketReply, TicketReturn, TicketWant
from quantload.load.tickets import Ticket, TicketBook

if TYPE_CHECKING:  # Locust's own types; the module runs without importing locust
    from locust.env import Environment
    from locust.runners import MasterRunner, WorkerRunner


class TicketSource(Protocol):
    """Where a user gets its next request; `take` blocks the user's greenlet. `done` is the lane
    of the ticket the user has just finished (`Ticket.lane`), so a tenant's next one may go."""

    def take(self, done: str | None = None) -> Ticket | None: ...


class LocalTickets:
    """Tickets from a book in this process (local runner)."""

    def __init__(self) -> None:
        self.book: TicketBook[AsyncResult] = TicketBook(lambda waiter, ticket: waiter.set(ticket))

    def take(self, done: str | None = None) -> Ticket | None:
        waiter = AsyncResult()
        self.book.want(waiter, done)
        try:
            ticket: Ticket | None = waiter.get()
        except gevent.GreenletExit:
            if not self.book.withdraw(waiter) and waiter.ready() and waiter.value is not None:
                self.book.put_back(waiter.value)
            raise
        return ticket


class MasterTickets:
    """The master's book: waiters are (worker id, want number), answered by message."""

    def __init__(self, runner: MasterRunner) -> None:
        self.runner = runner
        self.book: TicketBook[tuple[str, int]] = TicketBook(self._deliver)
        runner.register_message(TicketWant.NAME, self._on_want)
        runner.register_message(TicketReturn.NAME, self._on_return)

    def _deliver(self, waiter: tuple[str, int], ticket: Ticket | None) -> None:
        client_id, want = waiter
        self.runner.send_message(TicketReply.NAME, TicketReply(want, ticket).to_data(), client_id)

    def _on_want(self, environment: Environment, msg: Any, **_: Any) -> None:
        want = TicketWant.from_data(msg.data)
        self.book.want((str(msg.node_id), want.want), want.done)

    def _on_return(self, environment: Environment, msg: Any, **_: Any) -> None:
        self.book.put_back(TicketReturn.from_data(msg.data).ticket)


class WorkerTickets:
    """A worker's users ask the master for tickets."""

    def __init__(self, runner: WorkerRunner) -> None:
        self.runner = runner
        self._waiting: dict[int, AsyncResult] = {}
        self._next = 0
        runner.register_message(TicketReply.NAME, self._on_reply)

    def take(self, done: str | None = None) -> Ticket | None:
        self._next += 1
        want = self._next
        waiter = AsyncResult()
        self._waiting[want] = waiter
        self.runner.send_message(TicketWant.NAME, TicketWant(want, done).to_data())
        try:
            ticket: Ticket | None = waiter.get()
        finally:
            self._waiting.pop(want, None)
        return ticket

    def _on_reply(self, environment: Environment, msg: Any, **_: Any) -> None:
        reply = TicketReply.from_data(msg.data)
        waiter = self._waiting.pop(reply.want, None)
        if waiter is None:
            if reply.ticket is not None:  # the user stopped meanwhile: give the ticket back
                self.runner.send_message(TicketReturn.NAME, TicketReturn(reply.ticket).to_data())
            return
        waiter.set(reply.ticket)


class NoTickets:
    """The master sends no requests itself."""

    def take(self, done: str | None = None) -> Ticket | None:
        return None
