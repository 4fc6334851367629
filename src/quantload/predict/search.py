"""The limit search the load would run, run on simulated levels: what it can show within its budget.

A real search level sends until the SLO's judge decides it or the level's budget runs out
(quantload.load.level_judgement), and the search (quantload.load.limit_search) picks its next
level from those outcomes until its time cap. Both are pure, so they run here unchanged on a
simulated level's requests, fed in the order they finish: each level's decision and the simulated
seconds it took, then the search's limit, its undecided levels, where its misses begin and how
long it takes.

The percentile limit (quantload.predict.limit) says what the server carries; this says what a
search with these settings will be able to show. A level whose share over a limit sits near its
allowance, or that finishes too few requests within its budget (a p90 at 8 users needs about
29 bursts of 8 with none over), stays undecided in the model as on the server, and the search's
limit is then below the percentile limit. The simulation is deterministic around its seeds, so
the model's levels decide a little sooner than a noisy server's. A level whose simulated requests
run out while it is undecided and its budget lasts says so (SIMULATION_ENDED): more simulated
requests could decide it.
"""

from __future__ import annotations

__all__ = ["LevelBudget", "LevelDecision", "SearchRules", "decide_level", "predict_search"]

from collections.abc import Callable
from dataclasses import dataclass

from quantload.evidence import Decision
from quantload.load.level_judgement import LevelJudgement
from quantload.load.limit_search import LimitResult, LimitSearch, Trial
from quantload.load.plan import requests_before_a_miss_stops
from quantload.predict.simulator import SimResult
from quantload.slo import Slo

SIMULATION_ENDED = "its simulated requests ran out before its budget"


@dataclass(frozen=True)
class LevelBudget:
    """What a search level may send: its planned requests (`users` x `planned_per_user`, at least
    `fewest_planned`) whatever is decided, then more while undecided, up to `max_requests` and
    `max_s` seconds of sending."""

    max_s: float
    max_requests: int
    planned_per_user: int = 1
    fewest_planned: int = 1

    def planned(self, users: int) -> int:
        """The requests a level of `users` sends even when decided at once."""
        return max(self.fewest_planned, users * self.planned_per_user)


@dataclass(frozen=True)
class LevelDecision:
    """A simulated level's verdict as the load reaches it: the outcome, the simulated seconds from
    its first request sent to its last one finished, the requests judged, and why it is undecided
    where the budget is not the reason (SIMULATION_ENDED)."""

    outcome: Decision
    seconds: float
    requests: int
    why: str = ""


@dataclass(frozen=True)
class SearchRules:
    """The limit search's settings (quantload.config.LimitSettings) for closed-loop users."""

    start_users: int
    max_users: int
    growth: float
    time_cap_s: float


def decide_level(
    result: SimResult, slo: Slo, users: int, budget: LevelBudget, warmup_requests: int = 0
) -> LevelDecision:
    """Judge a simulated closed-loop level as its requests finish, as the load does: it stops at
    the first decision once its planned requests are in (a miss as soon as each user has sent
    one), or when the budget is spent."""
    judged = sorted(result.records[warmup_requests:], key=lambda record: record.end_s)
    if not judged:
        return LevelDecision("undecided", 0.0, 0)
    judgement = LevelJudgement(
        slo, users, open_loop=False, rate_rps=None, max_requests=budget.max_requests, max_s=budget.max_s
    )
    began_s = min(record.arrival_s for record in judged)
    planned = budget.planned(users)
    outcome: Decision = "undecided"
    seconds = 0.0
    spent = False
    for count, record in enumerate(judged, start=1):
        sent_s = record.arrival_s - began_s
        if count > planned and judgement.out_of_budget(sent_s):
            spent = True
            break
        ok = not record.failed
        outcome = judgement.add(
            ok, True, record.ttft_s if ok else None, None, record.tpot_s if ok else None, record.e2e_s
        )
        seconds = record.end_s - began_s
        if outcome == "misses" and count >= requests_before_a_miss_stops(users):
            break
        if outcome == "meets" and count >= planned:
            break
    ended = outcome == "undecided" and not spent
    return LevelDecision(outcome, seconds, judgement.requests, SIMULATION_ENDED if ended else "")


def predict_search(decide: Callable[[int], LevelDecision], rules: SearchRules) -> LimitResult:
    """The search's result over levels decided by `decide(users)`, its time in simulated seconds."""
    search = LimitSearch(
        kind="users", start=rules.start_users, max_level=rules.max_users, growth=rules.growth,
        time_cap_s=rules.time_cap_s,
    )  # fmt: skip
    while (level := search.next_level()) is not None:
        decided = decide(int(level))
        search.record(Trial(level, decided.outcome, seconds=decided.seconds, why=decided.why))
    return search.result()
