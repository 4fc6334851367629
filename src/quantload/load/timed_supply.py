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


class TimedSupply:
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
        self.book = book
        self.pool = tuple(pool)
        self.tracker = tracker
        self.low_water = max(users, 1)
        self.ends_at_s = ends_at_s
        self.rate_rps = rate_rps
        self.handed_before = book.handed_records
        self.next_seq = 0
        self.next_due_s = starts_at_s
        self._rng = random.Random(seed)
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
            self._schedule(min(now_s + LOOKAHEAD_S, self.ends_at_s))

    def finish(self) -> None:
        """No more tickets: closed loop, those no user took are dropped; open loop, those already
        scheduled are still sent."""
        self.stopped = True
        if self.rate_rps is None:
            self._drop_untaken()

    def _drop_untaken(self) -> None:
        self.book.cancel_pending()
        self.tracker.planned = self.book.handed_records - self.handed_before

    def _schedule(self, until_s: float) -> None:
        rate = self.rate_rps or 1.0
        batch = []
        while self.next_due_s < until_s:
            batch.append(self._ticket(self.next_due_s))
            self.next_due_s += self._rng.expovariate(rate)
        if batch:
            self._add(batch)

    def _ticket(self, due_unix_s: float | None) -> Ticket:
        ticket = self.pool[self.next_seq % len(self.pool)]
        made = dataclasses.replace(ticket, seq=self.next_seq, intended_unix_s=due_unix_s)
        self.next_seq += 1
        return made

    def _add(self, tickets: Sequence[Ticket]) -> None:
        self.tracker.planned += sum(ticket.record_count for ticket in tickets)
        self.book.add(tickets)
