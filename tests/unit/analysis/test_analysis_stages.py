"""Stage and level tables against the raw records, recomputed here with numpy."""

from __future__ import annotations

import json
from pathlib import Path
from statistics import median
from typing import Any

import numpy as np
import pytest
from analysis_synthetic import write_synthetic_run

from quantload.analysis.run_data import load_run
from quantload.analysis.stage_tables import UNFINISHED, UNRECORDED, level_table, stage_table
from quantload.slo import Slo

SLO = Slo(1.0, 0.1)


def raw(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "records.jsonl").read_text().splitlines() if line]


def by_stage(records: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        out.setdefault(record["stage_id"], []).append(record)
    return out


def test_each_stage_is_computed_from_its_own_records(synthetic_run: Path) -> None:
    table = stage_table(load_run(synthetic_run), SLO)
    groups = by_stage(raw(synthetic_run))
    assert set(table["stage_id"]) == set(groups)
    for row in table.to_dict("records"):
        records = [r for r in groups[row["stage_id"]] if r["ok"]]
        ttft = np.array([r["ttft_s"] for r in records])
        assert row["ttft_p99_s"] == pytest.approx(np.percentile(ttft, 99, method="linear"))
        assert row["tpot_p50_s"] == pytest.approx(np.median([r["tpot_s"] for r in records]))
        span = max(r["sent_unix_s"] + r["e2e_s"] for r in records) - min(r["sent_unix_s"] for r in records)
        tokens = sum(r["completion_tokens"] for r in records)
        assert row["output_tok_s"] == pytest.approx(tokens / span)
        good = sum(1 for r in records if r["ttft_s"] <= SLO.ttft_s and r["tpot_s"] <= SLO.tpot_s)
        assert row["goodput_rps"] == pytest.approx(good / span)
        assert row["status"] == "ok" and row["failed"] == 0


def test_levels_are_medians_of_repeats_with_their_range(synthetic_run: Path) -> None:
    run = load_run(synthetic_run)
    stages = stage_table(run, SLO)
    levels = level_table(stages, "sweep", "users", run.quants())
    assert list(zip(levels["quant"], levels["users"], strict=True)) == [
        ("Q8_0", 1), ("Q8_0", 2), ("Q4_K_M", 1), ("Q4_K_M", 2),
    ]  # fmt: skip
    groups = by_stage(raw(synthetic_run))
    for row in levels.to_dict("records"):
        per_repeat = [
            float(np.percentile([r["ttft_s"] for r in records], 50, method="linear"))
            for records in groups.values()
            if records[0]["quant"] == row["quant"]
            and records[0]["stage_users"] == row["users"]
            and records[0]["experiment"] == "sweep"
        ]
        assert len(per_repeat) == row["repeats_used"] == 2
        assert row["ttft_p50_s"] == pytest.approx(median(per_repeat))
        assert (row["ttft_p50_s_min"], row["ttft_p50_s_max"]) == pytest.approx(
            (min(per_repeat), max(per_repeat))
        )


def _rewrite_stages(run_dir: Path, change: Any) -> None:
    path = run_dir / "stages.jsonl"
    kept = [
        line for line in (change(json.loads(x)) for x in path.read_text().splitlines()) if line is not None
    ]
    path.write_text("".join(json.dumps(line) + "\n" for line in kept))


def test_failed_and_unfinished_stages_are_left_out_and_named(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "run")
    first_stage = "Q8_0-sweep-0"  # Q8_0, 1 user, repeat 0
    second_stage = "Q8_0-sweep-1"  # Q8_0, 2 users, repeat 0

    def change(event: dict[str, Any]) -> dict[str, Any] | None:
        if event["stage_id"] == first_stage and event["event"] == "stage_end":
            return {**event, "status": "failed", "reason": "circuit breaker"}
        if event["stage_id"] == second_stage and event["event"] == "stage_end":
            return None
        return event

    _rewrite_stages(run_dir, change)
    run = load_run(run_dir)
    stages = stage_table(run, SLO)
    status = dict(zip(stages["stage_id"], stages["status"], strict=True))
    assert status[first_stage] == "failed" and status[second_stage] == UNFINISHED
    levels = level_table(stages, "sweep", "users", run.quants()).set_index(["quant", "users"])
    assert levels.loc[("Q8_0", 1), "repeats_used"] == 1
    assert levels.loc[("Q8_0", 1), "excluded"] == ["repeat 0: failed (circuit breaker)"]
    only = stages.set_index("stage_id").loc["Q8_0-sweep-2"]  # the repeat that counts
    assert levels.loc[("Q8_0", 1), "ttft_p99_s"] == pytest.approx(only["ttft_p99_s"])
    assert "unfinished" in levels.loc[("Q8_0", 2), "excluded"][0]


def test_without_stages_jsonl_every_record_is_used(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "run")
    (run_dir / "stages.jsonl").unlink()
    stages = stage_table(load_run(run_dir), SLO)
    assert set(stages["status"]) == {UNRECORDED}
    levels = level_table(stages, "sweep", "users", ["Q8_0", "Q4_K_M"])
    assert (levels["repeats_used"] == 2).all()


def test_failed_requests_count_against_the_stage(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "run", failures=2)
    stages = stage_table(load_run(run_dir), SLO)
    sweep = stages[stages["experiment"] == "sweep"]
    assert (sweep["failed"] == 2).all() and (sweep["requests"] == 6).all()
    assert sweep["failed_frac"].tolist() == pytest.approx([2 / 6] * len(sweep))
    assert sweep.iloc[0]["errors"] == {"http_5xx": 2}


def _rewrite_records(run_dir: Path, change: Any) -> list[dict[str, Any]]:
    path = run_dir / "records.jsonl"
    records = [change(r) for r in raw(run_dir)]
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return records


def test_goodput_counts_only_requests_within_their_deadline(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "run", users_levels=(1,), repeats=1)
    slow = {"n": 0}

    def past_deadline(record: dict[str, Any]) -> dict[str, Any]:
        if record["ok"] and not record["warmup"] and slow["n"] < 2:  # answered, but after the deadline
            slow["n"] += 1
            record["within_deadline"] = False
        return record

    records = _rewrite_records(run_dir, past_deadline)
    loose = Slo(60.0, 60.0)  # every ok request meets the SLO
    for row in stage_table(load_run(run_dir), loose).to_dict("records"):
        mine = [r for r in records if r["stage_id"] == row["stage_id"] and r["ok"] and not r["warmup"]]
        span = max(r["sent_unix_s"] + r["e2e_s"] for r in mine) - min(r["sent_unix_s"] for r in mine)
        within = sum(1 for r in mine if r["within_deadline"])
        assert row["goodput_rps"] == pytest.approx(within / span)
    assert slow["n"] == 2


def test_open_loop_goodput_judges_ttft_from_the_intended_send(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "run", users_levels=(), repeats=1, open_loop_rates=(2.0,))
    slo = Slo(1.0, 60.0)

    def behind_schedule(record: dict[str, Any]) -> dict[str, Any]:
        if record["ok"]:
            record["ttft_s"] = 0.2  # fast once sent ...
            record["ttft_from_intended_s"] = 1.5  # ... but sent long after it was due
        return record

    _rewrite_records(run_dir, behind_schedule)
    rows = [r for r in stage_table(load_run(run_dir), slo).to_dict("records") if r["experiment"] == "open_loop"]
    assert len(rows) == 2  # one per quantization
    assert all(row["requests_per_s"] > 0 and row["goodput_rps"] == 0 for row in rows)
