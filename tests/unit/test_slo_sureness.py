"""How sure a verdict that meets the SLO is: the upper bound of the share over a limit shrinks
with the requests it rests on (exact one-sided 95 % bound), and is never the trivial 100 %."""

from __future__ import annotations

import pytest

from quantload.slo import Slo, SloCounts, judge


def _meets(requests: int) -> str:
    counts = SloCounts(requests=requests, ttft_over=0, tpot_judged=requests, tpot_over=0, good=requests)
    verdict = judge(counts, Slo(1.0, 0.1))
    assert verdict.meets is True
    return verdict.sureness


@pytest.mark.parametrize(("requests", "bound"), [(10, "26 %"), (100, "3 %"), (300, "1 %")])
def test_a_verdict_that_meets_bounds_the_share_over_a_limit(requests: int, bound: str) -> None:
    text = _meets(requests)
    assert f"rests on {requests} requests" in text and f"at most {bound} of requests" in text, text
