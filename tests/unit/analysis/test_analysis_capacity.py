"""The SLO verdict per level and the capacity sentence."""

from __future__ import annotations

from typing import Any

import pandas as pd

from quantload.analysis.capacity import capacity, check_level
from quantload.config import ReportSettings
from quantload.slo import SloCounts

SLO = ReportSettings(slo_ttft_p99_s=1.0, slo_tpot_s=0.1)
REQUESTS = 100  # per repeat


def counts(ttft: float | None, tpot: float | None, failed: float, over: int = 30) -> SloCounts:
    """A repeat's SLO counts that fit its figures: `over` requests past a limit its p99 breaks."""
    if ttft is None:
        return SloCounts()
    lost = round(failed * REQUESTS)
    ttft_over = over if ttft > SLO.slo_ttft_p99_s else 0
    tpot_over = over if tpot is not None and tpot > SLO.slo_tpot_s else 0
    good = REQUESTS - lost - max(ttft_over, tpot_over)
    return SloCounts(REQUESTS, lost, ttft_over, REQUESTS - lost, tpot_over, good)


def levels(
    quant: str, rows: list[tuple[int, float | None, float | None, float]], repeats: int = 2
) -> pd.DataFrame:
    """Level rows (users, ttft_p99_s, tpot_p99_s, failed_frac); every repeat equal to the median."""
    out: list[dict[str, Any]] = []
    for users, ttft, tpot, failed in rows:
        row: dict[str, Any] = {
            "quant": quant,
            "users": users,
            "output_tok_s": 10.0 * users,
            "goodput_rps": 1.0,
        }
        for name, value in (("ttft_p99_s", ttft), ("tpot_p99_s", tpot), ("failed_frac", failed)):
            row[name] = row[f"{name}_min"] = row[f"{name}_max"] = value
        one = counts(ttft, tpot, failed)
        together = SloCounts()
        for _ in range(repeats):
            together = together + one
        row.update({f"slo_{k}": v for k, v in together.to_dict().items()})
        row["repeat_counts"] = [one.to_dict()] * repeats if one.requests else []
        out.append(row)
    return pd.DataFrame(out)


def test_capacity_is_the_last_level_before_the_first_miss() -> None:
    table = levels("Q4_K_M", [(1, 0.2, 0.03, 0), (2, 0.5, 0.05, 0), (4, 1.5, 0.08, 0), (8, 3.0, 0.2, 0)])
    (verdict,) = capacity(table, ["Q4_K_M"], SLO)
    assert verdict.max_users == 2 and verdict.output_tok_s == 20.0
    assert "meets the SLO up to 2 concurrent user(s)" in verdict.sentence
    assert "at 4 users 60 of 200 requests over the TTFT limit" in verdict.sentence
    assert "TTFT p99 is 1.50 s" in verdict.sentence
    assert [c.meets for c in verdict.checks] == [True, True, False, False]
    assert all(c.requests == 200 and "rests on 200 requests" in c.sureness for c in verdict.checks)


def test_all_levels_meeting_says_the_limit_was_not_reached() -> None:
    (verdict,) = capacity(levels("F16", [(1, 0.1, 0.01, 0), (2, 0.2, 0.02, 0)]), ["F16"], SLO)
    assert verdict.max_users == 2 and "highest level tested" in verdict.sentence


def test_missing_even_the_first_level() -> None:
    (verdict,) = capacity(levels("F16", [(1, 0.4, 0.15, 0), (2, 0.9, 0.3, 0)]), ["F16"], SLO)
    assert verdict.max_users is None
    assert verdict.sentence == (
        "F16 misses the SLO even at 1 concurrent user(s): 60 of 200 requests over the TPOT limit"
        " (100 ms) (30 %) (TTFT p99 is 400 ms, TPOT p99 is 150 ms)."
    )


def test_failures_beyond_chance_above_one_percent_fail_a_level() -> None:
    check = check_level("Q8_0", levels("Q8_0", [(4, 0.2, 0.02, 0.05)]).iloc[0].to_dict(), SLO)
    assert check.meets is False and "10 of 200 requests failed" in check.why
    one = check_level("Q8_0", levels("Q8_0", [(4, 0.2, 0.02, 0.01)], repeats=1).iloc[0].to_dict(), SLO)
    assert one.meets is True  # 1 failed of 100 is the 1 % the SLO allows


def test_a_non_monotonic_curve_is_called_out() -> None:
    table = levels("Q8_0", [(1, 0.2, 0.02, 0), (2, 1.2, 0.02, 0), (4, 0.8, 0.02, 0)])
    (verdict,) = capacity(table, ["Q8_0"], SLO)
    assert verdict.max_users == 1 and "not monotonic" in verdict.sentence


def test_a_level_not_met_in_every_repeat_is_said() -> None:
    table = levels("Q8_0", [(1, 0.2, 0.02, 0)], repeats=3)
    slow = SloCounts(REQUESTS, 0, 5, REQUESTS, 0, REQUESTS - 5)  # one repeat: 5 % over the TTFT limit
    table.at[0, "repeat_counts"] = [counts(0.2, 0.02, 0).to_dict()] * 2 + [slow.to_dict()]
    table["slo_ttft_over"] = 5  # 5 of 300 together: within chance
    (verdict,) = capacity(table, ["Q8_0"], SLO)
    assert verdict.max_users == 1 and "not every repeat met it" in verdict.sentence


def test_no_figures_is_not_measured_never_a_guess() -> None:
    (verdict,) = capacity(pd.DataFrame(), ["Q8_0"], SLO)
    assert verdict.max_users is None and verdict.sentence.startswith("Q8_0: not measured")
    (partial,) = capacity(levels("Q8_0", [(1, None, None, 0)]).assign(failed_frac=None), ["Q8_0"], SLO)
    assert partial.checks[0].meets is None and "not measured" in partial.sentence
