"""The service-level objective, judged in one place: the sweep, the limit search, the tuner, the
capacity verdict, the plan and the report all ask this module.

- **What a request that meets the SLO is**: it succeeded within its deadline, its TTFT is within
  `slo.ttft_s` and its TPOT within `slo.tpot_s`. In open loop (arrivals on a schedule: Poisson or a
  trace) TTFT counts from the intended send time, so a client that fell behind its schedule cannot
  hide the wait (coordinated omission); in closed loop from the send.
- **Goodput** is the count (or rate) of such requests: DistServe's definition, the only one.
- **Open or closed loop** comes from the stage's arrival process (`Arrival`), never from the
  experiment's name.
- **A level's verdict**: the SLO says the TTFT and TPOT percentiles the user names (p50 ... p99.9)
  are within their limits and at most `slo.max_failed_frac` of requests fail. "TTFT p95 <= L" means
  "at most 5 % of requests are over L", so the judge counts the requests over each limit and weighs
  each count against its allowance with anytime-valid evidence (quantload.evidence): the level
  *meets* when the data show, at `slo.confidence`, that no share is over its allowance; it *misses*
  when they show that one is; otherwise it is *undecided*, and says about how many more requests
  would likely decide it. Because the evidence stays valid however often it is looked at, the
  sweep and the limit search judge after every request and stop sending once a level is decided.
  Overs that come in bursts count for what their bursts are worth (the design effect, with a prior
  of `slo.burst_requests`, by default the requests in flight at once).
- A verdict on a stage whose server lost its CPU to other processes cannot be "misses" (the machine
  was measured); it is undecided with that reason. A "meets" stands: the server met the SLO even so.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, Literal

from quantload.evidence import (
    Blocks,
    Decision,
    ShareEvidence,
    ShareRule,
    fewest_requests_to_meet,
    judge_share,
    upper_share,
)
from quantload.text_format import duration, percent

if TYPE_CHECKING:
    from quantload.config import SloSettings

Arrival = Literal["closed", "poisson", "trace"]
OPEN_LOOP_ARRIVALS: frozenset[str] = frozenset({"poisson", "trace"})
Percentile = Literal["p50", "p90", "p95", "p99", "p99.9"]
PERCENTILES: dict[str, float] = {"p50": 0.50, "p90": 0.90, "p95": 0.95, "p99": 0.99, "p99.9": 0.999}
MAX_FAILED_FRAC = 0.01  # the SLO's default share of failed requests
CONFIDENCE = 0.95  # the default confidence of every verdict
Outcome = Literal["meets", "misses", "undecided", "unjudged"]


def arrival_of(arrival: str | None, rate_rps: float | None) -> Arrival:
    """A stage's arrival process: as its stage line says, else (runs written before stage lines
    carried it) open loop where the stage had an arrival rate."""
    if arrival in ("closed", "poisson", "trace"):
        return arrival  # type: ignore[return-value]
    return "closed" if rate_rps is None else "poisson"


def is_open_loop(arrival: str | None, rate_rps: float | None = None) -> bool:
    """Whether a stage's requests were sent on a schedule (latency from the intended send time)."""
    return arrival_of(arrival, rate_rps) in OPEN_LOOP_ARRIVALS


def allowed_over_frac(percentile: str) -> float:
    """The share of requests a percentile limit lets over it: 1 % for p99."""
    return 1.0 - PERCENTILES[percentile]


@dataclass(frozen=True)
class Slo:
    """The latency limits with their percentiles, the failed share a level must keep, and how sure
    a verdict must be (`confidence`; `burst_requests`: the requests one slow episode is assumed to
    hit until the data say otherwise, 0 = the requests in flight at once)."""

    ttft_s: float
    tpot_s: float
    ttft_percentile: Percentile = "p99"
    tpot_percentile: Percentile = "p99"
    max_failed_frac: float = MAX_FAILED_FRAC
    confidence: float = CONFIDENCE
    burst_requests: int = 0

    @classmethod
    def of(cls, settings: SloSettings) -> Slo:
        """The SLO of the [slo] settings."""
        return cls(
            ttft_s=settings.ttft_s,
            tpot_s=settings.tpot_s,
            ttft_percentile=settings.ttft_percentile,
            tpot_percentile=settings.tpot_percentile,
            max_failed_frac=settings.max_failed_frac,
            confidence=settings.confidence,
            burst_requests=settings.burst_requests,
        )

    def with_limits(self, ttft_s: float | None, tpot_s: float | None) -> Slo:
        """The same SLO with other latency limits where given (a tenant's own)."""
        return Slo(
            ttft_s or self.ttft_s, tpot_s or self.tpot_s, self.ttft_percentile, self.tpot_percentile,
            self.max_failed_frac, self.confidence, self.burst_requests,
        )  # fmt: skip

    @property
    def alpha(self) -> float:
        return 1.0 - self.confidence

    @property
    def ttft_allowed_frac(self) -> float:
        return allowed_over_frac(self.ttft_percentile)

    @property
    def tpot_allowed_frac(self) -> float:
        return allowed_over_frac(self.tpot_percentile)

    def text(self) -> str:
        """The SLO in words, with the fewest requests a level meets on."""
        return (
            f"TTFT {self.ttft_percentile} ≤ {duration(self.ttft_s)} and TPOT {self.tpot_percentile}"
            f" ≤ {duration(self.tpot_s)}, with at most {percent(self.max_failed_frac, 0)} of requests"
            f" failed, decided at {percent(self.confidence, 0)} confidence ({self.fewest_text()})"
        )

    def fewest_text(self) -> str:
        """How few requests a level can meet on, and which allowance asks for them."""
        alpha = self.alpha
        needs = {
            f"the TTFT {self.ttft_percentile}": fewest_requests_to_meet(self.ttft_allowed_frac, alpha),
            f"the TPOT {self.tpot_percentile}": fewest_requests_to_meet(self.tpot_allowed_frac, alpha),
            f"the {percent(self.max_failed_frac, 0)} failed allowance": fewest_requests_to_meet(
                self.max_failed_frac, alpha
            ),
        }
        most = max(needs.values())
        asking = [what for what, count in needs.items() if count == most]
        named = asking[0] if len(asking) == 1 else f"{', '.join(asking[:-1])} and {asking[-1]}"
        return f"a level meets on no fewer than {most:,} requests, for {named}"

    def fewest_requests(self) -> int:
        """The fewest requests with which a level can meet this SLO at all (none over a limit, none
        failed, requests independent): what a level's budget must allow."""
        alpha = self.alpha
        return max(
            fewest_requests_to_meet(share, alpha)
            for share in (self.ttft_allowed_frac, self.tpot_allowed_frac, self.max_failed_frac)
        )

    def key(self) -> tuple[float, float, str, str, float]:
        """What a request's counts depend on (a summary judged against another key is recounted)."""
        return (self.ttft_s, self.tpot_s, self.ttft_percentile, self.tpot_percentile, self.max_failed_frac)


def judged_ttft_s(ttft_s: float | None, ttft_from_intended_s: float | None, open_loop: bool) -> float | None:
    """The TTFT the SLO judges: from the intended send time in open loop, from the send otherwise."""
    if open_loop and ttft_from_intended_s is not None:
        return ttft_from_intended_s
    return ttft_s


def burst_prior(slo: Slo, in_flight: float | None) -> float:
    """The requests one slow episode is assumed to hit: `slo.burst_requests`, or (0) the requests
    in flight at once (a closed loop's users, an open loop's delivered concurrency), at least 1."""
    if slo.burst_requests > 0:
        return float(slo.burst_requests)
    return max(1.0, math.ceil(in_flight or 1.0))


def block_size(burst_requests: float) -> int:
    """Requests per block of the design effect's batch means: two bursts' worth, at least 2."""
    return max(2, int(2 * math.ceil(burst_requests)))


@dataclass(frozen=True)
class SloCounts:
    """What the verdict rests on: measured requests, failed ones, those over each limit, good ones,
    and for the design effect the blocks of consecutive requests: how many complete blocks of
    `block_requests`, and for each share its count within them and the sum of its per-block counts
    squared.

    Counts add up (`+`), so repeats of a level are judged on all their requests together (their
    blocks are of one size: the level's).
    """

    requests: int = 0
    failed: int = 0
    ttft_over: int = 0  # succeeded with a TTFT over the limit
    tpot_judged: int = 0  # succeeded with a TPOT (two tokens or more)
    tpot_over: int = 0
    good: int = 0  # met the SLO on its own: goodput
    blocks: int = 0
    block_requests: int = 0
    failed_blocked: int = 0
    failed_sq: int = 0
    ttft_over_blocked: int = 0
    ttft_over_sq: int = 0
    tpot_over_blocked: int = 0
    tpot_over_sq: int = 0
    ttft_near: int = 0  # within the TTFT limit by less than the client's stated error

    def __add__(self, other: SloCounts) -> SloCounts:
        summed = {f.name: getattr(self, f.name) + getattr(other, f.name) for f in fields(self)}
        summed["block_requests"] = max(self.block_requests, other.block_requests)
        return SloCounts(**summed)

    @property
    def ok(self) -> int:
        """Requests that succeeded."""
        return self.requests - self.failed

    def share_blocks(self, share: str) -> Blocks:
        """The blocks of one share ("failed", "ttft_over", "tpot_over")."""
        size = max(1, self.block_requests)
        return Blocks(self.blocks, size, getattr(self, f"{share}_blocked"), getattr(self, f"{share}_sq"))

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> SloCounts:
        """Counts as a summary or a table row keeps them (counts written before the blocks were kept
        have none: their design effect is the prior's)."""
        known = {f.name for f in fields(cls)}
        return cls(**{name: int(data.get(name) or 0) for name in known})


def total(counts: Iterable[SloCounts]) -> SloCounts:
    """The counts of several stages together."""
    summed = SloCounts()
    for one in counts:
        summed = summed + one
    return summed


@dataclass
class _Share:
    """One share's count, and its count and squares over the finished blocks."""

    count: int = 0
    in_block: int = 0
    blocked: int = 0
    squares: int = 0

    def add(self, over: bool, block_ends: bool) -> None:
        if over:
            self.count += 1
            self.in_block += 1
        if block_ends:
            self.blocked += self.in_block
            self.squares += self.in_block * self.in_block
            self.in_block = 0


@dataclass
class SloCounter:
    """Counts requests against an SLO one at a time, in the order they finish (the load's stage
    summaries and the sequential decision use it); blocks of `block_requests` consecutive requests
    give the design effect."""

    slo: Slo
    open_loop: bool
    block_requests: int = 2
    margin_s: float = 0.0  # the client's stated timing error: TTFTs this close under the limit are "near"
    requests: int = 0
    tpot_judged: int = 0
    good: int = 0
    ttft_near: int = 0
    _failed: _Share = field(default_factory=_Share)
    _ttft: _Share = field(default_factory=_Share)
    _tpot: _Share = field(default_factory=_Share)

    def add(
        self,
        ok: bool,
        within_deadline: bool,
        ttft_s: float | None,
        ttft_from_intended_s: float | None,
        tpot_s: float | None,
    ) -> None:
        """One measured request."""
        self.requests += 1
        ends = self.requests % max(1, self.block_requests) == 0
        ttft = judged_ttft_s(ttft_s, ttft_from_intended_s, self.open_loop)
        ttft_met = ok and ttft is not None and ttft <= self.slo.ttft_s
        if ttft_met and ttft is not None and ttft > self.slo.ttft_s - self.margin_s:
            self.ttft_near += 1
        tpot_met = True
        if ok and tpot_s is not None:
            self.tpot_judged += 1
            tpot_met = tpot_s <= self.slo.tpot_s
        self._failed.add(not ok, ends)
        self._ttft.add(ok and not ttft_met, ends)
        self._tpot.add(ok and tpot_s is not None and not tpot_met, ends)
        if ok and within_deadline and ttft_met and tpot_met:
            self.good += 1

    def counts(self) -> SloCounts:
        return SloCounts(
            requests=self.requests,
            failed=self._failed.count,
            ttft_over=self._ttft.count,
            tpot_judged=self.tpot_judged,
            tpot_over=self._tpot.count,
            good=self.good,
            blocks=self.requests // max(1, self.block_requests),
            block_requests=self.block_requests,
            failed_blocked=self._failed.blocked,
            failed_sq=self._failed.squares,
            ttft_over_blocked=self._ttft.blocked,
            ttft_over_sq=self._ttft.squares,
            tpot_over_blocked=self._tpot.blocked,
            tpot_over_sq=self._tpot.squares,
            ttft_near=self.ttft_near,
        )


@dataclass(frozen=True)
class ShareTest:
    """One of the SLO's three shares (failed, over the TTFT limit, over the TPOT limit), weighed."""

    what: str  # "failed", "over the TTFT limit (1.00 s)", ...
    evidence: ShareEvidence
    upper_frac: float | None = None  # the anytime-valid upper bound of the true share

    @property
    def count(self) -> int:
        return self.evidence.over

    @property
    def of(self) -> int:
        return self.evidence.of

    @property
    def allowed_frac(self) -> float:
        return self.evidence.allowed

    def text(self) -> str:
        share = self.count / self.of if self.of else 0.0
        return f"{self.count} of {self.of} requests {self.what} ({percent(share, 1)})"


@dataclass(frozen=True)
class SloRules:
    """The SLO's three shares as the judge weighs them, made once (the load weighs per request)."""

    failed: ShareRule
    ttft: ShareRule
    tpot: ShareRule

    @classmethod
    def of(cls, slo: Slo) -> SloRules:
        return cls(
            ShareRule.of(slo.max_failed_frac),
            ShareRule.of(slo.ttft_allowed_frac),
            ShareRule.of(slo.tpot_allowed_frac),
        )


def weigh(
    counts: SloCounts,
    slo: Slo,
    burst_requests: float,
    bounds: bool = False,
    near_counts_over: bool = False,
    rules: SloRules | None = None,
    estimate_more: bool = True,
) -> tuple[ShareTest, ...]:
    """The evidence about each of the SLO's shares (pure arithmetic, the load processes call it per
    request with the SLO's `rules` made once and no estimate of more requests; `bounds` adds each
    share's upper bound, which needs scipy). `near_counts_over`: a client not trusted within its
    stated error cannot meet a limit closer than that error, so the TTFTs within it under the limit
    count as over for the meets side."""
    alpha = slo.alpha
    misses_alpha = alpha / 3  # one of three shares missing by chance: at most alpha in all
    made = rules if rules is not None else SloRules.of(slo)
    shares = (
        ("failed", counts.failed, counts.requests, counts.share_blocks("failed"), made.failed),
        (
            f"over the TTFT limit ({duration(slo.ttft_s)})",
            counts.ttft_over, counts.ok, counts.share_blocks("ttft_over"), made.ttft,
        ),
        (
            f"over the TPOT limit ({duration(slo.tpot_s)})",
            counts.tpot_over, counts.tpot_judged, counts.share_blocks("tpot_over"), made.tpot,
        ),
    )  # fmt: skip
    tests = []
    for index, (what, over, of, blocks, allowed) in enumerate(shares):
        evidence = judge_share(over, of, blocks, allowed, alpha, misses_alpha, burst_requests, estimate_more)
        if index == 1 and near_counts_over and counts.ttft_near and evidence.decision == "meets":
            cautious = judge_share(
                over + counts.ttft_near, of, blocks, allowed, alpha, misses_alpha, burst_requests
            )
            if cautious.decision != "meets":
                evidence = replace(evidence, decision="undecided", more_requests=None)
        upper = upper_share(over, of, evidence.design_effect, alpha) if bounds and of else None
        tests.append(ShareTest(what, evidence, upper))
    return tuple(tests)


def decision_of(tests: Iterable[ShareTest]) -> Decision:
    """Misses when any share misses; meets when every judged share meets; else undecided. A share
    nothing was judged on (no TPOT: one-token answers) does not hold the level back."""
    tests = list(tests)
    if any(t.evidence.decision == "misses" for t in tests):
        return "misses"
    judged = [t for t in tests if t.of > 0]
    if judged and all(t.evidence.decision == "meets" for t in judged):
        return "meets"
    return "undecided"


@dataclass(frozen=True)
class Verdict:
    """A stage's or a level's verdict against the SLO, with what it rests on and how sure it is."""

    outcome: Outcome
    hard_failure: bool
    why: str  # why it misses, what it kept when it meets, what it lacks when undecided
    counts: SloCounts
    sureness: str  # how many requests it rests on and how sure it is, in words
    shares: tuple[ShareTest, ...] = ()
    more_requests: int | None = None  # undecided: about how many more requests would likely decide it

    @property
    def meets(self) -> bool:
        return self.outcome == "meets"

    @property
    def misses(self) -> bool:
        return self.outcome == "misses"

    @property
    def decided(self) -> bool:
        return self.outcome in ("meets", "misses")

    @property
    def requests(self) -> int:
        """How many requests the verdict rests on."""
        return self.counts.requests

    def text(self) -> str:
        """The verdict, its reasons and how sure it is, in one line."""
        if self.outcome == "unjudged":
            return self.why
        head = {
            "meets": f"meets the SLO ({self.why})",
            "misses": f"misses the SLO: {self.why}",
            "undecided": f"undecided: {self.why}",
        }[self.outcome]
        return f"{head}; {self.sureness}"


def _requests(count: int) -> str:
    return f"{count} request{'s' if count != 1 else ''}"


def judge(
    counts: SloCounts,
    slo: Slo,
    in_flight: float | None = None,
    hard_failure_frac: float | None = None,
    machine_busy: str | None = None,
    client_untrusted: str | None = None,
) -> Verdict:
    """The verdict of a stage, or of a level's stages together (see the module docstring).

    `in_flight`: the requests in flight at once (closed-loop users), the prior of the design
    effect unless `slo.burst_requests` sets it. `hard_failure_frac` (the limit search's): a failed
    share at or above it misses at once, as a hard failure. `machine_busy`: why the server's CPU
    was not its own during the stage; a miss then becomes undecided. `client_untrusted`: why the
    load client's timing may be worse than its stated error; the level then cannot meet the TTFT
    limit by less than that error.
    """
    rests = f"rests on {_requests(counts.requests)}"
    if counts.requests == 0:
        return Verdict("unjudged", False, "no measured request", counts, rests)
    if counts.ok == 0:
        return Verdict("misses", True, f"all {counts.requests} requests failed", counts, rests)
    failed_frac = counts.failed / counts.requests
    if hard_failure_frac is not None and failed_frac >= hard_failure_frac:
        why = f"{counts.failed} of {counts.requests} requests failed ({percent(failed_frac, 0)})"
        return Verdict(
            "misses", True, why, counts, f"{rests}; a hard failure (at least {percent(hard_failure_frac, 0)})"
        )
    burst = burst_prior(slo, in_flight)
    tests = weigh(counts, slo, burst, bounds=True, near_counts_over=client_untrusted is not None)
    outcome = decision_of(tests)
    confidence = percent(slo.confidence, 0)
    deff = max(t.evidence.design_effect for t in tests)
    clustered = f"; overs counted in bursts of about {deff:.1f} requests" if deff > 1.05 else ""
    if outcome == "misses":
        missed = [t for t in tests if t.evidence.decision == "misses"]
        why = "; ".join(t.text() for t in missed)
        if machine_busy:
            return Verdict(
                "undecided", False, f"{why}, but {machine_busy}", counts,
                f"{rests}; a busy machine, not the server, may have caused it", tests, None,
            )  # fmt: skip
        sure = (
            f"{rests}; at {confidence} confidence more than {percent(missed[0].allowed_frac, 1)} are"
            f" {missed[0].what}{clustered}"
        )
        return Verdict("misses", False, why, counts, sure, tests)
    if outcome == "meets":
        loosest = max(tests[1:], key=lambda t: t.upper_frac if t.upper_frac is not None else -1.0)
        kept = f"{counts.ttft_over + counts.tpot_over} over a latency limit, {counts.failed} failed"
        bound = loosest.upper_frac if loosest.upper_frac is not None else loosest.allowed_frac
        sure = (
            f"{rests}; at {confidence} confidence at most {percent(bound, 1)} of requests are"
            f" {loosest.what}{clustered}"
        )
        return Verdict("meets", False, kept, counts, sure, tests)
    open_tests = [t for t in tests if t.of and t.evidence.decision == "undecided"]
    seen = "; ".join(t.text() for t in open_tests) or "nothing judged"
    more = [t.evidence.more_requests for t in open_tests]
    known = [m for m in more if m is not None]
    if more and all(m is not None for m in more) and known:
        need = f"about {max(known):,} more requests would likely decide it"
        more_requests: int | None = max(known)
    else:
        need = "the share sits at its allowance, so more requests may not decide it"
        more_requests = None
    busy = f"; {machine_busy}" if machine_busy else ""
    if client_untrusted and counts.ttft_near:
        busy += (
            f"; {counts.ttft_near} TTFTs lie within the client's stated error under the limit and the"
            f" client may have been worse than that ({client_untrusted})"
        )
    return Verdict(
        "undecided", False, f"{seen}{busy}", counts, f"{rests}; {need}{clustered}", tests, more_requests
    )
