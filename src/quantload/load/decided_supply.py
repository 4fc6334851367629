"""A decided stage's tickets: its planned requests, then the same again until its level is decided.

A sweep level or a limit-search trial is judged as its requests finish (quantload.load.
level_judgement). `DecidedSupply` hands out the stage's planned tickets at once, then, while the
level is undecided and its budget lasts, keeps the book supplied with the same requests again
(fresh sequence numbers): closed loop, whenever fewer tickets wait than there are users; open loop,
Poisson arrivals at the stage's rate continuing after the last planned one, scheduled up to
LOOKAHEAD_S ahead. It stops making tickets once the level is decided or its budget is spent:

- decided "misses": the tickets no user has taken are dropped as soon as the stage has recorded
  its `min_requests` (a clearly broken level costs a few requests);
- decided "meets": the stage still sends its planned requests (its figures rest on them), nothing
  more;
- budget spent: the planned requests still go, nothing more.

The stage's planned record count grows with what was made, so the stage ends once every ticket
handed out is recorded. Plain Python: no Locust, no gevent, no clock (the caller passes the time).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from quantload.load.level_judgement import LevelJudgement
from quantload.load.tickets import StageTracker, Ticket, TicketBook
from quantload.load.timed_supply import LOOKAHEAD_S, TicketCycle


class DecidedSupply(TicketCycle):
    """Keeps one decided stage's ticket book supplied until its level is decided or out of budget."""

    def __init__(
        self,
        book: TicketBook[Any],
        planned: Sequence[Ticket],
        tracker: StageTracker,
        level: LevelJudgement,
        users: int,
        starts_at_s: float,
        min_requests: int,
        rate_rps: float | None = None,
        seed: int = 0,
    ) -> None:
        if not planned:
            raise ValueError("a decided stage needs at least one request to repeat")
        super().__init__(book, planned, tracker, rate_rps, seed, next_seq=len(planned))
        self.level = level
        self.low_water = max(users, 1)
        self.starts_at_s = starts_at_s
        self.min_requests = min_requests
        due = [t.intended_unix_s for t in self.pool if t.intended_unix_s is not None]
        self.next_due_s = (max(due) + self._gap()) if due else starts_at_s
        self.stopped = False
        self.stop_reason: str | None = None
        tracker.planned = sum(ticket.record_count for ticket in self.pool)
        book.add(self.pool)

    @property
    def running(self) -> bool:
        """True until the supply has stopped making tickets and dropped what it should."""
        return not self.stopped

    def tick(self, now_s: float) -> None:
        """Stop, or make the tickets due by now (see the module docstring)."""
        if self.stopped:
            return
        level = self.level
        if level.outcome == "misses":
            if self.tracker.done >= min(self.min_requests, self.tracker.planned):
                self._stop("the level misses the SLO", drop=True)
            return
        if level.outcome == "meets":
            self._stop("the level meets the SLO", drop=False)
            return
        if level.out_of_budget(max(0.0, now_s - self.starts_at_s)):
            self._stop("the level's budget is spent", drop=False)
            return
        if self.rate_rps is None:
            if self.book.pending < self.low_water:
                self._add([self._ticket(None) for _ in range(self.low_water)])
        else:
            self.next_due_s = self._schedule(self.next_due_s, now_s + LOOKAHEAD_S)

    def finish(self) -> None:
        """No more tickets, and those no user has taken are dropped (the stage was aborted)."""
        if not self.stopped:
            self._stop("the stage ended early", drop=True)

    def _stop(self, reason: str, drop: bool) -> None:
        self.stopped = True
        self.stop_reason = reason
        if drop:
            self._drop_untaken()
