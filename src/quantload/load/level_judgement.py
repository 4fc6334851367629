"""A level decided as its requests finish: the counts so far, the verdict they support, the budget.

The stage controller keeps one `LevelJudgement` per decided level of a plan (the stages of a sweep
level's repeats share it) and feeds it every measured record of those stages as it is recorded.
The verdict is quantload.slo's own (its pure-arithmetic part: no scipy in a load process), and the
evidence behind it stays valid however often it is asked, so the controller asks after every
record and stops sending once the level is decided. Plain Python: no Locust, no gevent, no clock.
"""

from __future__ import annotations

__all__ = ["LevelJudgement"]

from dataclasses import dataclass, field

from quantload.evidence import Decision
from quantload.slo import Slo, SloCounter, SloRules, block_size, burst_prior, decision_of, weigh

OPEN_LOOP_BLOCK_REQUESTS = 32  # open loop: blocks of this many requests (the in-flight count varies)


def level_block_requests(slo: Slo, users: int, open_loop: bool) -> int:
    """The design effect's block of a level: two bursts' worth of its closed-loop users (or the
    configured burst size), a fixed block in open loop. The summary counts use the same blocks."""
    if slo.burst_requests > 0:
        return block_size(slo.burst_requests)
    return OPEN_LOOP_BLOCK_REQUESTS if open_loop else block_size(users)


@dataclass
class LevelJudgement:
    """One level's running verdict and what it has spent."""

    slo: Slo
    users: int
    open_loop: bool
    rate_rps: float | None
    max_requests: int
    max_s: float
    counter: SloCounter = field(init=False)
    rules: SloRules = field(init=False)
    spent_s: float = 0.0  # seconds of sending in the level's finished stages
    e2e_sum_s: float = 0.0
    e2e_count: int = 0
    outcome: Decision = "undecided"

    def __post_init__(self) -> None:
        blocks = level_block_requests(self.slo, self.users, self.open_loop)
        self.counter = SloCounter(self.slo, self.open_loop, blocks)
        self.rules = SloRules.of(self.slo)

    @property
    def requests(self) -> int:
        return self.counter.requests

    def in_flight(self) -> float:
        """Requests in flight at once: the closed loop's users; in open loop, the rate times the
        mean time a request took so far (Little's law)."""
        if not self.open_loop or self.rate_rps is None:
            return float(self.users)
        if not self.e2e_count:
            return 1.0
        return self.rate_rps * self.e2e_sum_s / self.e2e_count

    def add(
        self,
        ok: bool,
        within_deadline: bool,
        ttft_s: float | None,
        ttft_from_intended_s: float | None,
        tpot_s: float | None,
        e2e_s: float | None,
    ) -> Decision:
        """One measured record of the level; the verdict after it."""
        self.counter.add(ok, within_deadline, ttft_s, ttft_from_intended_s, tpot_s)
        if e2e_s is not None:
            self.e2e_sum_s += e2e_s
            self.e2e_count += 1
        counts = self.counter.counts()
        burst = burst_prior(self.slo, self.in_flight())
        self.outcome = decision_of(weigh(counts, self.slo, burst, rules=self.rules, estimate_more=False))
        return self.outcome

    def out_of_budget(self, sending_s: float = 0.0) -> bool:
        """Whether the level has spent its requests or its seconds (`sending_s`: those of the
        stage now running)."""
        return self.requests >= self.max_requests or self.spent_s + sending_s >= self.max_s
