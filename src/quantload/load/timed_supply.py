"""A timed stage's tickets: its requests sent again and again until its time is up.

A soak slice is a stage bounded by time, not by a count of requests. Its plan holds a small pool
of requests, and `TimedSupply` makes the tickets as the slice goes:

- closed loop: whenever fewer tickets wait than there are users, the pool again (the same
  prompts, fresh sequence numbers), so no user waits for work. When the time is up the tickets no
  user has taken are dropped and the stage's planned count is fixed at the records handed out: the
  stage ends once the requests in flight at that moment have finished.
- open loop (`rate_rps`): Poisson arrivals at the rate, drawn from `seed`, cycling through the
  pool, scheduled up to LOOKAHEAD_S ahead and never at or after the end; every ticket scheduled is
  sent, late or not (a queue that builds up is what the slice measures), so the planned count is
  the number scheduled.

Either way the planned record count grows with what was made, and nothing is kept once a ticket
is handed out: a slice of an hour costs the plan and the process as much as a slice of a minute.
Plain Python: no Locust, no gevent, no clock (the caller passes the time, wall-clock seconds).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from typing import Any

from quantload.load.tickets import StageTracker, Ticket, TicketBook

LOOKAHEAD_S = 1.0


class TicketCycle:
    """A pool of requests handed out again and again: each copy with a fresh sequence number,
    every ticket added to the book counted as planned, open-loop arrivals drawn from `seed` at
    `rate_rps`, and what no user took dropped on a stop. The timed and the decided supplies build
    on it."""

    def __init__(
        self,
        book: TicketBook[Any],
        pool: Sequence[Ticket],
        tracker: StageTracker,
        rate_rps: float | None,
        seed: int,
        next_seq: int = 0,
    ) -> None:
        self.book = book
        self.pool = tuple(pool)
        self.tracker = tracker
        self.rate_rps = rate_rps
        self.handed_before = book.handed_records
        self.next_seq = next_seq
        self._rng = random.Random(seed)

    def _gap(self) -> float:
        """Seconds to the next open-loop arrival (0 in a closed loop)."""
        return self._rng.expovariate(self.rate_rps) if self.rate_rps else 0.0

    def _schedule(self, next_due_s: float, until_s: float) -> float:
        """Add the arrivals due from `next_due_s` until `until_s`; return the next one's time."""
        batch = []
        while next_due_s < until_s:
            batch.append(self._ticket(next_due_s))
            next_due_s += self._gap()
        if batch:
            self._add(batch)
        return next_due_s

    def _drop_untaken(self) -> None:
        self.book.cancel_pending()
        self.tracker.planned = self.book.handed_records - self.handed_before

    def _ticket(self, due_unix_s: float | None) -> Ticket:
        ticket = self.pool[self.next_seq % len(self.pool)]
        made = dataclasses.replace(ticket, seq=self.next_seq, intended_unix_s=due_unix_s)
        self.next_seq += 1
        return made

    def _add(self, tickets: Sequence[Ticket]) -> None:
        self.tracker.planned += sum(ticket.record_count for ticket in tickets)
        self.book.add(tickets)


class TimedSupply(TicketCycle):
    """Keeps one timed stage's ticket book supplied until `ends_at_s`, then stops."""

    def __init__(
        self,
        book: TicketBook[Any],
        pool: Sequence[Ticket],
        tracker: StageTracker,
        users: int,
        starts_at_s: float,
        ends_at_s: float,
        rate_rps: float | None = None,
        seed: int = 0,
    ) -> None:
        if not pool:
            raise ValueError("a timed stage needs at least one request to repeat")
        super().__init__(book, pool, tracker, rate_rps, seed)
        self.low_water = max(users, 1)
        self.ends_at_s = ends_at_s
        self.next_due_s = starts_at_s
        self.stopped = False

    @property
    def running(self) -> bool:
        """True until the time is up (or the stage was stopped)."""
        return not self.stopped

    def tick(self, now_s: float) -> None:
        """Make the tickets due by now (closed loop: top the book up; open loop: schedule ahead),
        or, once the time is up, stop (`finish`). After a closed-loop stop every tick drops again
        what reached the book since (a ticket a worker gave back), so nothing of this stage is
        left for the next one."""
        if self.stopped:
            if self.rate_rps is None:
                self._drop_untaken()
            return
        if now_s >= self.ends_at_s:
            self.finish()
        elif self.rate_rps is None:
            if self.book.pending < self.low_water:
                self._add([self._ticket(None) for _ in self.pool])
        else:
            self.next_due_s = self._schedule(self.next_due_s, min(now_s + LOOKAHEAD_S, self.ends_at_s))

    def finish(self) -> None:
        """No more tickets: closed loop, those no user took are dropped; open loop, those already
        scheduled are still sent."""
        self.stopped = True
        if self.rate_rps is None:
            self._drop_untaken()
