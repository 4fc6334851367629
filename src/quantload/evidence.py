"""Anytime-valid evidence that a share of requests is within, or beyond, what the SLO allows.

An SLO allows a share `allowed` of requests over each limit (1 % for a p99 limit). Whether a level
keeps it is decided sequentially, after every request if need be: two e-values measure the evidence
that the true share is below `allowed` ("meets") and above it ("misses"). Each is a likelihood ratio
averaged over a fixed set of alternative shares on its side (a mixture sequential probability ratio
test); under its null it is a non-negative supermartingale, so by Ville's inequality the chance that
it ever reaches 1/alpha is at most alpha, however often it is looked at and whenever the sending
stops. A level said to meet while more than `allowed` of its requests are over the limit is
therefore at most alpha of the levels so judged. Shares close to `allowed` (between the nearest
alternatives) collect evidence slowly: such a level stays undecided until its budget ends.

Requests are not independent. A stall or a long prefill slows the requests in flight together, so
the overs come in bursts and a count of ten overs may be one event. Counts are divided by a design
effect before the test (Rao & Scott's correction for clustered binomial data): the size-biased mean
number of overs per block of consecutive requests (batch means), shrunk towards a prior
`burst_requests`, the number of requests one slow episode may hit (by default the requests in
flight at once). With no over seen, a level therefore gets the evidence of its bursts' worth of
requests, not of its requests; isolated overs bring the factor down towards 1 as they accumulate,
and overs that come in bursts raise it. tests/unit/test_evidence.py and benchmarks/verdict_truth.py
hold the error rates on data of known truth, bursts included.

Pure Python (the load processes judge as requests arrive and must not import numpy or scipy); the
one function that inverts the test, `upper_share`, imports scipy where it is called.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Decision = Literal["meets", "misses", "undecided"]

# Alternatives, as distances in log-odds from the allowed share: the meets side tests shares
# 0.6, 0.37, 0.14 and 0.05 times a 1 % allowance; the misses side 1.6, 2.7, 6.9 and 35 %.
MEETS_ALTERNATIVES_LOGIT: tuple[float, ...] = (0.5, 1.0, 2.0, 3.0)
MISSES_ALTERNATIVES_LOGIT: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0)
PRIOR_WEIGHT = 3.0  # pseudo-overs at the prior burst size in the design effect's estimate
MAX_MORE_REQUESTS = 1_000_000  # beyond this, "more requests" is not within reach


def _logit(share: float) -> float:
    return math.log(share / (1.0 - share))


def _expit(value: float) -> float:
    return 1.0 / (1.0 + math.exp(-value))


def alternatives(allowed: float, side: Decision) -> tuple[float, ...]:
    """The alternative shares the e-value of `side` averages over."""
    if not 0.0 < allowed < 1.0:
        raise ValueError(f"an allowed share must be between 0 and 1, not {allowed}")
    centre = _logit(allowed)
    if side == "meets":
        return tuple(_expit(centre - d) for d in MEETS_ALTERNATIVES_LOGIT)
    if side == "misses":
        return tuple(_expit(centre + d) for d in MISSES_ALTERNATIVES_LOGIT)
    raise ValueError("side is meets or misses")


Coefficients = tuple[tuple[float, float], ...]  # per alternative: log(q/a), log((1-q)/(1-a))


def coefficients(allowed: float, side: Decision) -> Coefficients:
    """What the e-value of `side` needs of each alternative, computed once per allowance."""
    return tuple(
        (math.log(q / allowed), math.log((1.0 - q) / (1.0 - allowed))) for q in alternatives(allowed, side)
    )


def log_mixture(over: float, of: float, terms: Coefficients) -> float:
    """The log of the mixture likelihood ratio with these coefficients."""
    if of <= 0:
        return 0.0
    under = of - over
    values = [over * up + under * down for up, down in terms]
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values) / len(values))


def log_e_value(over: float, of: float, allowed: float, side: Decision) -> float:
    """The log of the mixture likelihood ratio of `side` against the share being exactly `allowed`,
    after `of` requests of which `over` were over the limit (real numbers: counts after the design
    effect)."""
    return log_mixture(over, of, coefficients(allowed, side))


@dataclass(frozen=True)
class ShareRule:
    """One share's allowance and the e-values' coefficients, made once (the load judges per
    request)."""

    allowed: float
    meets: Coefficients
    misses: Coefficients

    @classmethod
    def of(cls, allowed: float) -> ShareRule:
        return cls(allowed, coefficients(allowed, "meets"), coefficients(allowed, "misses"))


@dataclass(frozen=True)
class Blocks:
    """What the design effect of one share is estimated from: its count over complete blocks of
    `size` consecutive requests, and the sum of those counts squared."""

    count: int = 0  # blocks
    size: int = 1  # requests per block
    over: int = 0  # overs within the complete blocks
    squares: int = 0  # sum over the complete blocks of (overs in the block) squared


def design_effect(blocks: Blocks, burst_requests: float, prior_weight: float = PRIOR_WEIGHT) -> float:
    """The factor by which clustered overs inflate a count's variance (batch means): the spread of
    the blocks' counts against the binomial spread independent requests would give, with
    `prior_weight` units of that spread at the prior `burst_requests`; at least 1. For rare overs it
    is about the size-biased mean of overs per block; a level whose every request is over (no
    spread to read) keeps the prior."""
    prior = max(1.0, float(burst_requests))
    spread = expected = 0.0
    if blocks.count >= 2 and blocks.size >= 1:
        share = blocks.over / (blocks.count * blocks.size)
        spread = max(0.0, blocks.squares - blocks.over**2 / blocks.count)
        expected = (blocks.count - 1) * blocks.size * share * (1.0 - share)
    return max(1.0, (spread + prior_weight * prior) / (expected + prior_weight))


@dataclass(frozen=True)
class ShareEvidence:
    """Where one share stands: the evidence on each side and what it decides."""

    over: int
    of: int
    allowed: float
    design_effect: float
    log_meets: float
    log_misses: float
    decision: Decision
    more_requests: int | None  # undecided: about how many more requests would likely decide it

    @property
    def share(self) -> float:
        return self.over / self.of if self.of else 0.0


def judge_share(
    over: int,
    of: int,
    blocks: Blocks,
    allowed: float | ShareRule,
    alpha_meets: float,
    alpha_misses: float,
    burst_requests: float,
    estimate_more: bool = True,
) -> ShareEvidence:
    """The evidence about one share (failed, over the TTFT limit, over the TPOT limit).

    Meets when the meets e-value reaches 1/alpha_meets, misses when the misses one reaches
    1/alpha_misses, else undecided with (`estimate_more`) an estimate of the requests that would
    likely decide it.
    """
    rule = allowed if isinstance(allowed, ShareRule) else ShareRule.of(allowed)
    deff = design_effect(blocks, burst_requests) if of else 1.0
    over_eff, of_eff = over / deff, of / deff
    log_meets = log_mixture(over_eff, of_eff, rule.meets)
    log_misses = log_mixture(over_eff, of_eff, rule.misses)
    need_meets, need_misses = -math.log(alpha_meets), -math.log(alpha_misses)
    decision: Decision = "undecided"
    if log_misses >= need_misses:
        decision = "misses"
    elif log_meets >= need_meets:
        decision = "meets"
    more = None
    if decision == "undecided" and estimate_more:
        more = _more_requests(over, of, rule.allowed, deff, need_meets - log_meets, need_misses - log_misses)
    return ShareEvidence(over, of, rule.allowed, deff, log_meets, log_misses, decision, more)


def _more_requests(
    over: int, of: int, allowed: float, deff: float, to_meets: float, to_misses: float
) -> int | None:
    """About how many more requests at the share seen so far would bring either e-value to its
    threshold (the mean gain per request of the best alternative; the mixture's averaging adds
    the log of the number of alternatives). None when neither side gains at that share."""
    seen = min(max(over / of if of else 0.0, 1e-6), 1 - 1e-6)  # the share so far, off 0 and 1
    needed = []
    for side, left in (("meets", to_meets), ("misses", to_misses)):
        count = len(alternatives(allowed, side))  # type: ignore[arg-type]
        gain = max(
            seen * math.log(q / allowed) + (1 - seen) * math.log((1 - q) / (1 - allowed))
            for q in alternatives(allowed, side)  # type: ignore[arg-type]
        )
        if gain > 0:
            needed.append((max(left, 0.0) + math.log(count)) / gain * deff)
    if not needed:
        return None
    more = math.ceil(min(needed))
    return more if more <= MAX_MORE_REQUESTS else None


def fewest_requests_to_meet(allowed: float, alpha: float) -> int:
    """The fewest requests, none of them over, with which a share can meet at all (a design effect
    of 1): the least a level's budget must allow for `allowed` at confidence 1 - alpha."""
    need = -math.log(alpha)
    low, high = 1, 1
    while log_e_value(0.0, float(high), allowed, "meets") < need:
        low, high = high, high * 2
        if high > 10**9:
            raise ValueError("no budget meets this share")
    while low < high:
        middle = (low + high) // 2
        if log_e_value(0.0, float(middle), allowed, "meets") >= need:
            high = middle
        else:
            low = middle + 1
    return high


def upper_share(over: int, of: int, deff: float, alpha: float) -> float:
    """The anytime-valid upper confidence bound of the share: the largest allowance whose meets
    test the data have not yet passed (1.0 when the data rule nothing out)."""
    if of <= 0:
        return 1.0
    from scipy.optimize import brentq  # the report's side only

    need = -math.log(alpha)
    over_eff, of_eff = over / deff, of / deff

    def gap(allowed: float) -> float:
        return log_e_value(over_eff, of_eff, allowed, "meets") - need

    top = 1.0 - 1e-9
    if gap(top) < 0:
        return 1.0
    low = max(over / of, 1e-9)
    if gap(low) >= 0:
        return low
    return float(brentq(gap, low, top, xtol=1e-7))
