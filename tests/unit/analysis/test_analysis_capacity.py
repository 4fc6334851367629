"""The SLO verdict per level and the capacity sentence."""

from __future__ import annotations

from typing import Any

import pandas as pd

from quantload.analysis.capacity import capacity, check_level
from quantload.config import ReportSettings

SLO = ReportSettings(slo_ttft_p99_s=1.0, slo_tpot_s=0.1)


def levels(quant: str, rows: list[tuple[int, float | None, float | None, float]]) -> pd.DataFrame:
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
        out.append(row)
    return pd.DataFrame(out)


def test_capacity_is_the_last_level_before_the_first_miss() -> None:
    table = levels("Q4_K_M", [(1, 0.2, 0.03, 0), (2, 0.5, 0.05, 0), (4, 1.5, 0.08, 0), (8, 3.0, 0.2, 0)])
    (verdict,) = capacity(table, ["Q4_K_M"], SLO)
    assert verdict.max_users == 2 and verdict.output_tok_s == 20.0
    assert "meets the SLO up to 2 concurrent user(s)" in verdict.sentence
    assert "at 4 users TTFT p99 is 1.50 s" in verdict.sentence
    assert [c.meets for c in verdict.checks] == [True, True, False, False]


def test_all_levels_meeting_says_the_limit_was_not_reached() -> None:
    (verdict,) = capacity(levels("F16", [(1, 0.1, 0.01, 0), (2, 0.2, 0.02, 0)]), ["F16"], SLO)
    assert verdict.max_users == 2 and "highest level tested" in verdict.sentence


def test_missing_even_the_first_level() -> None:
    (verdict,) = capacity(levels("F16", [(1, 0.4, 0.15, 0), (2, 0.9, 0.3, 0)]), ["F16"], SLO)
    assert verdict.max_users is None
    assert verdict.sentence == "F16 misses the SLO even at 1 concurrent user(s): TPOT p99 is 150 ms."


def test_failures_above_one_percent_fail_a_level() -> None:
    check = check_level("Q8_0", levels("Q8_0", [(4, 0.2, 0.02, 0.05)]).iloc[0].to_dict(), SLO)
    assert check.meets is False and "5.0 % of requests failed" in check.why


def test_a_non_monotonic_curve_is_called_out() -> None:
    table = levels("Q8_0", [(1, 0.2, 0.02, 0), (2, 1.2, 0.02, 0), (4, 0.8, 0.02, 0)])
    (verdict,) = capacity(table, ["Q8_0"], SLO)
    assert verdict.max_users == 1 and "not monotonic" in verdict.sentence


def test_a_level_not_met_in_every_repeat_is_said() -> None:
    table = levels("Q8_0", [(1, 0.2, 0.02, 0)])
    table["ttft_p99_s_max"] = 1.3
    (verdict,) = capacity(table, ["Q8_0"], SLO)
    assert verdict.max_users == 1 and "not every repeat met it" in verdict.sentence


def test_no_figures_is_not_measured_never_a_guess() -> None:
    (verdict,) = capacity(pd.DataFrame(), ["Q8_0"], SLO)
    assert verdict.max_users is None and verdict.sentence.startswith("Q8_0: not measured")
    (partial,) = capacity(levels("Q8_0", [(1, None, None, 0)]).assign(failed_frac=None), ["Q8_0"], SLO)
    assert partial.checks[0].meets is None and "not measured" in partial.sentence
