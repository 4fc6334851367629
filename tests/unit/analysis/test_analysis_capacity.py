"""The SLO verdict per level and the capacity sentence: the capacity is the highest level that
meets with every lower level meeting; where misses begin and the undecided levels are said."""

from __future__ import annotations

from typing import Any

import pandas as pd

from quantload.analysis.capacity import capacity, check_level
from quantload.slo import Slo, SloCounts

SLO = Slo(ttft_s=1.0, tpot_s=0.1, burst_requests=1)  # requests independent: the counts decide alone


def counts(requests: int, ttft_over: int = 0, tpot_over: int = 0, failed: int = 0) -> SloCounts:
    ok = requests - failed
    good = ok - max(ttft_over, tpot_over)
    return SloCounts(
        requests, failed, ttft_over, ok, tpot_over, good, blocks=requests // 2, block_requests=2,
        failed_blocked=failed, failed_sq=failed, ttft_over_blocked=ttft_over, ttft_over_sq=ttft_over,
        tpot_over_blocked=tpot_over, tpot_over_sq=tpot_over,
    )  # every over in a block of its own


def levels(quant: str, rows: list[tuple[int, SloCounts, float | None]]) -> pd.DataFrame:
    """Level rows (users, counts, TTFT at the SLO's percentile)."""
    out: list[dict[str, Any]] = []
    for users, together, ttft in rows:
        row: dict[str, Any] = {
            "quant": quant,
            "users": users,
            "output_tok_s": 10.0 * users,
            "goodput_rps": 1.0,
            "ttft_at_slo_s": ttft,
            "tpot_at_slo_s": 0.05,
            "failed_frac": together.failed / together.requests if together.requests else None,
        }
        row.update({f"slo_{k}": v for k, v in together.to_dict().items()})
        out.append(row)
    return pd.DataFrame(out)


MET, OPEN, MISSED = counts(800), counts(100), counts(40, ttft_over=20)


def test_capacity_is_the_highest_level_met_with_every_lower_level_met() -> None:
    table = levels("Q4_K_M", [(1, MET, 0.2), (2, MET, 0.5), (4, OPEN, 0.8), (8, MISSED, 3.0)])
    (verdict,) = capacity(table, ["Q4_K_M"], SLO)
    assert verdict.max_users == 2 and verdict.output_tok_s == 20.0
    assert [c.outcome for c in verdict.checks] == ["meets", "meets", "undecided", "misses"]
    assert verdict.undecided_users == (4,) and verdict.first_miss_users == 8
    assert "meets the SLO up to 2 concurrent users" in verdict.sentence
    assert "undecided at 4 users" in verdict.sentence
    assert "misses from 8 concurrent users: 20 of 40 requests over the TTFT limit" in verdict.sentence
    assert "TTFT p99 is 3.00 s" in verdict.sentence


def test_no_capacity_rests_on_an_undecided_level() -> None:
    (verdict,) = capacity(levels("F16", [(1, OPEN, 0.2), (2, MET, 0.2)]), ["F16"], SLO)
    assert verdict.max_users is None and verdict.held_users is None and not verdict.decided
    assert "no level was shown to meet the SLO" in verdict.sentence
    assert "more requests would likely decide it" in verdict.sentence


def test_all_levels_meeting_says_the_limit_was_not_reached() -> None:
    (verdict,) = capacity(levels("F16", [(1, MET, 0.1), (2, MET, 0.2)]), ["F16"], SLO)
    assert verdict.max_users == 2 and "highest level tested" in verdict.sentence


def test_missing_even_the_first_level() -> None:
    (verdict,) = capacity(levels("F16", [(1, MISSED, 1.5), (2, MISSED, 2.0)]), ["F16"], SLO)
    assert verdict.max_users is None
    assert verdict.sentence.startswith("F16 misses the SLO even at 1 concurrent user: 20 of 40 requests")


def test_failures_beyond_their_allowance_fail_a_level() -> None:
    check = check_level("Q8_0", levels("Q8_0", [(4, counts(60, failed=10), 0.2)]).iloc[0].to_dict(), SLO)
    assert check.outcome == "misses" and "10 of 60 requests failed" in check.why


def test_a_non_monotonic_curve_is_called_out() -> None:
    table = levels("Q8_0", [(1, MET, 0.2), (2, MISSED, 1.2), (4, MET, 0.8)])
    (verdict,) = capacity(table, ["Q8_0"], SLO)
    assert verdict.max_users == 1 and "not monotonic" in verdict.sentence


def test_no_figures_is_not_measured_never_a_guess() -> None:
    (verdict,) = capacity(pd.DataFrame(), ["Q8_0"], SLO)
    assert verdict.max_users is None and verdict.sentence.startswith("Q8_0: not measured")
    (partial,) = capacity(levels("Q8_0", [(1, SloCounts(), None)]), ["Q8_0"], SLO)
    assert partial.checks[0].outcome == "unjudged" and "not measured" in partial.sentence


def test_a_busy_machine_makes_a_level_undecided_not_a_miss() -> None:
    table = levels("Q8_0", [(1, MET, 0.2), (2, MISSED, 3.0)])
    (verdict,) = capacity(table, ["Q8_0"], SLO, busy={("Q8_0", 2): "other processes took 70 % of the CPU"})
    assert [c.outcome for c in verdict.checks] == ["meets", "undecided"]
    assert "other processes took 70 %" in verdict.checks[1].why
