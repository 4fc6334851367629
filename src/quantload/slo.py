"""The service-level objective, judged in one place: the limit search, the capacity verdict, the
plan and the report all ask this module.

- **What a request that meets the SLO is**: it succeeded within its deadline, its TTFT is within
  `report.slo_ttft_p99_s` and its TPOT within `report.slo_tpot_s`. In open loop (arrivals on a
  schedule: Poisson or a trace) TTFT counts from the intended send time, so a client that fell
  behind its schedule cannot hide the wait (coordinated omission); in closed loop from the send.
- **Goodput** is the count (or rate) of such requests: DistServe's definition, the only one.
- **Open or closed loop** comes from the stage's arrival process (`Arrival`), never from the
  experiment's name.
- **A stage's or a level's verdict**: the SLO says the p99 of TTFT and of TPOT are within their
  limits and at most 1 % of requests fail. For a continuous latency, "p99 <= L" means "at most
  1 % of requests are over L", so the judge counts requests over each limit and tests each count
  against its 1 % with a one-sided binomial test: a level misses the SLO only when the count is
  beyond what a level just within it would show by chance (p < 5 %). One slow request among eight
  is not evidence (a p99 of eight requests is their maximum); three of eight are. Every verdict
  says how many requests it rests on and how sure it is: for a miss, that chance; for a pass, the
  share of requests over the limit that the data cannot rule out (95 % upper bound).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Literal

from quantload.config import ReportSettings
from quantload.text_format import duration, percent

Arrival = Literal["closed", "poisson", "trace"]
OPEN_LOOP_ARRIVALS: frozenset[str] = frozenset({"poisson", "trace"})
MAX_FAILED_FRAC = 0.01  # the SLO's share of failed requests
OVER_LIMIT_FRAC = 0.01  # the share over a latency limit a p99 objective allows
CONFIDENCE = 0.95  # a miss needs p < 1 - CONFIDENCE; a pass states the CONFIDENCE upper bound


def arrival_of(arrival: str | None, rate_rps: float | None) -> Arrival:
    """A stage's arrival process: as its stage line says, else (runs written before stage lines
    carried it) open loop where the stage had an arrival rate."""
    if arrival in ("closed", "poisson", "trace"):
        return arrival  # type: ignore[return-value]
    return "closed" if rate_rps is None else "poisson"


def is_open_loop(arrival: str | None, rate_rps: float | None = None) -> bool:
    """Whether a stage's requests were sent on a schedule (latency from the intended send time)."""
    return arrival_of(arrival, rate_rps) in OPEN_LOOP_ARRIVALS


@dataclass(frozen=True)
class Slo:
    """The latency limits and the failed share a level must keep."""

    ttft_p99_s: float
    tpot_p99_s: float
    max_failed_frac: float = MAX_FAILED_FRAC

    @classmethod
    def of(cls, report: ReportSettings) -> Slo:
        """The SLO of the [report] settings."""
        return cls(report.slo_ttft_p99_s, report.slo_tpot_s)

    def text(self) -> str:
        """The SLO in words."""
        return (
            f"TTFT p99 ≤ {duration(self.ttft_p99_s)} and TPOT p99 ≤ {duration(self.tpot_p99_s)},"
            f" with at most {percent(self.max_failed_frac, 0)} of requests failed"
        )


def judged_ttft_s(ttft_s: float | None, ttft_from_intended_s: float | None, open_loop: bool) -> float | None:
    """The TTFT the SLO judges: from the intended send time in open loop, from the send otherwise."""
    if open_loop and ttft_from_intended_s is not None:
        return ttft_from_intended_s
    return ttft_s


@dataclass(frozen=True)
class SloCounts:
    """What the verdict rests on: measured requests, failed ones, those over each limit, good ones.

    Counts add up (`+`), so repeats of a level are judged on all their requests together.
    """

    requests: int = 0
    failed: int = 0
    ttft_over: int = 0  # succeeded with a TTFT over the limit
    tpot_judged: int = 0  # succeeded with a TPOT (two tokens or more)
    tpot_over: int = 0
    good: int = 0  # met the SLO on its own: goodput

    def __add__(self, other: SloCounts) -> SloCounts:
        return SloCounts(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    @property
    def ok(self) -> int:
        """Requests that succeeded."""
        return self.requests - self.failed

    def to_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def total(counts: Iterable[SloCounts]) -> SloCounts:
    """The counts of several stages together."""
    summed = SloCounts()
    for one in counts:
        summed = summed + one
    return summed


@dataclass
class SloCounter:
    """Counts requests against an SLO one at a time (the load's stage summaries use it)."""

    slo: Slo
    open_loop: bool
    requests: int = 0
    failed: int = 0
    ttft_over: int = 0
    tpot_judged: int = 0
    tpot_over: int = 0
    good: int = 0

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
        if not ok:
            self.failed += 1
            return
        ttft = judged_ttft_s(ttft_s, ttft_from_intended_s, self.open_loop)
        ttft_met = ttft is not None and ttft <= self.slo.ttft_p99_s
        if not ttft_met:
            self.ttft_over += 1
        tpot_met = True
        if tpot_s is not None:
            self.tpot_judged += 1
            tpot_met = tpot_s <= self.slo.tpot_p99_s
            if not tpot_met:
                self.tpot_over += 1
        if within_deadline and ttft_met and tpot_met:
            self.good += 1

    def counts(self) -> SloCounts:
        return SloCounts(
            self.requests, self.failed, self.ttft_over, self.tpot_judged, self.tpot_over, self.good
        )


@dataclass(frozen=True)
class Excess:
    """One of the SLO's three shares (failed, over the TTFT limit, over the TPOT limit) as measured."""

    what: str  # "failed", "over the TTFT limit (1.00 s)", ...
    count: int
    of: int
    allowed_frac: float
    p_value: float  # the chance that a level just within the SLO shows `count` or more
    upper_frac: float  # CONFIDENCE upper bound of the true share

    @property
    def frac(self) -> float:
        return self.count / self.of if self.of else 0.0

    @property
    def above_allowed(self) -> bool:
        return self.count > 0 and self.frac > self.allowed_frac

    @property
    def misses(self) -> bool:
        """Beyond what chance gives a level within the SLO."""
        return self.above_allowed and self.p_value < 1 - CONFIDENCE

    def text(self) -> str:
        return f"{self.count} of {self.of} requests {self.what} ({percent(self.frac, 0)})"


def _excess(what: str, count: int, of: int, allowed: float) -> Excess:
    # Imported here: scipy.stats costs a noticeable fraction of a second, which only judging pays.
    from scipy.stats import binomtest

    if of <= 0:
        return Excess(what, 0, 0, allowed, 1.0, 1.0)
    test = binomtest(count, of, allowed, alternative="greater")
    # the one-sided upper bound of the share: the "greater" test's interval is [low, 1], so the
    # bound comes from the "less" side
    bound = binomtest(count, of, allowed, alternative="less")
    upper = float(bound.proportion_ci(confidence_level=CONFIDENCE, method="exact").high)
    return Excess(what, count, of, allowed, float(test.pvalue), upper)


@dataclass(frozen=True)
class Verdict:
    """A stage's or a level's verdict against the SLO, with what it rests on and how sure it is."""

    meets: bool | None  # None: nothing to judge
    hard_failure: bool
    why: str  # the reasons it misses; what it kept when it meets
    counts: SloCounts
    sureness: str  # how many requests it rests on and how sure it is, in words
    excesses: tuple[Excess, ...] = field(default_factory=tuple)

    @property
    def requests(self) -> int:
        """How many requests the verdict rests on."""
        return self.counts.requests

    def text(self) -> str:
        """The verdict, its reasons and how sure it is, in one line."""
        if self.meets is None:
            return self.why
        head = f"meets the SLO ({self.why})" if self.meets else f"misses the SLO: {self.why}"
        return f"{head}; {self.sureness}"


def judge(counts: SloCounts, slo: Slo, hard_failure_frac: float | None = None) -> Verdict:
    """The verdict of a stage, or of a level's repeats together (see the module docstring).

    `hard_failure_frac` (the limit search's): a failed share at or above it misses at once, as a
    hard failure, whatever the statistics say.
    """
    rests = f"rests on {counts.requests} request{'s' if counts.requests != 1 else ''}"
    if counts.requests == 0:
        return Verdict(None, False, "no measured request", counts, rests)
    if counts.ok == 0:
        return Verdict(False, True, f"all {counts.requests} requests failed", counts, rests)
    failed_frac = counts.failed / counts.requests
    if hard_failure_frac is not None and failed_frac >= hard_failure_frac:
        why = f"{counts.failed} of {counts.requests} requests failed ({percent(failed_frac, 0)})"
        return Verdict(
            False, True, why, counts, f"{rests}; a hard failure (at least {percent(hard_failure_frac, 0)})"
        )
    ttft_what = f"over the TTFT limit ({duration(slo.ttft_p99_s)})"
    tpot_what = f"over the TPOT limit ({duration(slo.tpot_p99_s)})"
    excesses = (
        _excess("failed", counts.failed, counts.requests, slo.max_failed_frac),
        _excess(ttft_what, counts.ttft_over, counts.ok, OVER_LIMIT_FRAC),
        _excess(tpot_what, counts.tpot_over, counts.tpot_judged, OVER_LIMIT_FRAC),
    )
    missed = [e for e in excesses if e.misses]
    if missed:
        worst = min(missed, key=lambda e: e.p_value)
        sure = f"{rests}; a level within the SLO shows this with p = {_p_text(worst.p_value)}"
        return Verdict(False, False, "; ".join(e.text() for e in missed), counts, sure, excesses)
    noisy = [e for e in excesses if e.above_allowed]
    kept = (
        "within chance: " + "; ".join(e.text() for e in noisy)
        if noisy
        else f"{counts.ttft_over + counts.tpot_over} over a latency limit, {counts.failed} failed"
    )
    loosest = max(excesses[1:], key=lambda e: e.upper_frac)
    sure = (
        f"{rests}; at {percent(CONFIDENCE, 0)} confidence at most {percent(loosest.upper_frac, 0)}"
        f" of requests are {loosest.what}"
    )
    return Verdict(True, False, kept, counts, sure, excesses)


def _p_text(p: float) -> str:
    return f"{p:.2g}" if p >= 0.0001 else "< 0.0001"
