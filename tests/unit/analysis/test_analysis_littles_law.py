"""Little's law on closed loops whose in-flight count is known by construction."""

from __future__ import annotations

from typing import Any

import pandas as pd
import pytest

from quantload.analysis.littles_law import ServerInFlight, littles_law_table, stage_windows


def closed_loop(users: int, per_user: int, duration_s: float, gap_s: float = 0.0) -> pd.DataFrame:
    """`users` users, each sending `per_user` requests of `duration_s`, `gap_s` apart."""
    rows: list[dict[str, Any]] = []
    for user in range(users):
        clock = 1000.0 + 0.001 * user
        for _ in range(per_user):
            rows.append({"stage_id": "s", "warmup": False, "ok": True, "sent_unix_s": clock,
                         "end_unix_s": clock + duration_s, "e2e_s": duration_s})  # fmt: skip
            clock += duration_s + gap_s
    return pd.DataFrame(rows)


def stages(users: int) -> pd.DataFrame:
    return pd.DataFrame([{"stage_id": "s", "experiment": "sweep", "status": "ok", "users": users,
                          "quant": "Q8_0", "rate_rps": None, "repeat": 0}])  # fmt: skip


def test_back_to_back_users_keep_exactly_n_in_flight() -> None:
    records = closed_loop(users=4, per_user=20, duration_s=0.5)
    windows = stage_windows(records, stages(4))
    table = littles_law_table(records, stages(4), windows, {"s": ServerInFlight(4.0, 0.0, 10)})
    row = table.iloc[0]
    assert row["predicted_in_flight"] == pytest.approx(4.0, rel=0.02)
    assert row["client_in_flight"] == pytest.approx(4.0, rel=0.01)
    assert row["flagged"] == "" and row["unjudged"] == ""


def test_think_time_lowers_concurrency_but_little_still_holds() -> None:
    records = closed_loop(users=4, per_user=20, duration_s=0.5, gap_s=0.5)
    windows = stage_windows(records, stages(4))
    row = littles_law_table(records, stages(4), windows, {}).iloc[0]
    assert row["client_in_flight"] == pytest.approx(2.0, rel=0.05)  # half the time in flight
    assert abs(row["client_diff"]) < 0.1 and row["flagged"] == ""
    assert row["server_processing"] is None


def test_a_server_that_saw_fewer_requests_is_flagged() -> None:
    records = closed_loop(users=4, per_user=20, duration_s=0.5)
    windows = stage_windows(records, stages(4))
    row = littles_law_table(records, stages(4), windows, {"s": ServerInFlight(3.0, 0.0, 10)}).iloc[0]
    assert row["flagged"] == "server" and row["server_diff"] == pytest.approx(1 / 3, rel=0.05)


def test_too_short_to_judge_is_not_a_flag() -> None:
    records = closed_loop(users=2, per_user=2, duration_s=0.5)
    windows = stage_windows(records, stages(2))
    row = littles_law_table(records, stages(2), windows, {"s": ServerInFlight(0.1, None, 1)}).iloc[0]
    assert (
        row["flagged"] == ""
        and "too few requests" in row["unjudged"]
        and "too few scrapes" in row["unjudged"]
    )
