"""A limit-search trial judged against the SLO, trial sizes, limits.jsonl, and which experiments a
run plans from its settings."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quantload.config import LimitSettings, LoadSettings, ReportSettings, Settings, TraceSettings
from quantload.errors import ConfigError
from quantload.load.limit_file import LimitLine, TrialLine, read_limits
from quantload.load.limit_runner import judge_trial, trial_requests
from quantload.load.records import RequestRecord
from quantload.load.summary import StageSummary
from quantload.served import ServedTarget
from quantload.steps.load import missing_input, planned_experiments, run_experiment

SLO = ReportSettings(slo_ttft_p99_s=0.5, slo_tpot_s=0.05)


def summary(**changes: Any) -> StageSummary:
    base: dict[str, Any] = dict(
        run_id="r", server="s", quant="q", experiment="limit_users", stage_id="st", stage_index=0, users=4,
        rate_rps=None, repeat=0, cache_prompt=False, status="ok", reason=None, requests_planned=10,
        requests_done=10, requests_ok=10, goodput_requests=10, errors={}, ttft_p50_s=0.1, ttft_p99_s=0.2,
        ttft_from_intended_p99_s=0.2, tpot_p50_s=0.01, tpot_p99_s=0.01, itl_p50_s=0.01, itl_p95_s=0.01,
        itl_p99_s=0.01, e2e_p50_s=0.3, output_tokens_per_s=10.0, delivered_concurrency=4.0, lag_p99_s=0.0,
        prefix_tokens=None, client_cpu_frac=0.1, loop_lag_p99_s=0.0, client_saturated=False,
    )  # fmt: skip
    base.update(changes)
    return StageSummary(**base)


def records(ttft: list[float], tpot: float = 0.01, lag: float = 0.0, failed: int = 0) -> list[RequestRecord]:
    out = []
    for index, value in enumerate(ttft):
        ok = index >= failed
        out.append(
            RequestRecord(
                run_id="r", server="s", quant="q", model="m", url="http://x", experiment="limit_users",
                stage_id="st", cache_prompt=False, prompt_id="p", worker="w", intended_unix_s=0.0,
                sent_unix_s=0.0, lag_s=lag, ttft_s=value if ok else None,
                ttft_from_intended_s=value + lag if ok else None, tpot_s=tpot if ok else None, ok=ok,
                within_deadline=ok,
            )
        )
    return out


def test_a_trial_within_the_slo_holds() -> None:
    verdict = judge_trial(summary(), records([0.1] * 10), SLO, False, 0.1)
    assert verdict.held and not verdict.hard_failure and "TTFT p99 100 ms" in verdict.why


def test_a_slow_trial_breaks_softly_and_a_failing_one_hard() -> None:
    slow = judge_trial(summary(), records([0.1] * 9 + [2.0]), SLO, False, 0.1)
    assert not slow.held and not slow.hard_failure and "TTFT p99" in slow.why
    tpot = judge_trial(summary(), records([0.1] * 10, tpot=0.2), SLO, False, 0.1)
    assert not tpot.held and "TPOT p99 200 ms" in tpot.why
    errors = judge_trial(summary(requests_ok=8), records([0.1] * 10, failed=2), SLO, False, 0.1)
    assert errors.hard_failure and "20% of requests failed" in errors.why
    few = judge_trial(summary(requests_ok=9), records([0.1] * 10, failed=1), SLO, False, 0.5)
    assert not few.held and not few.hard_failure and "10% failed" in few.why
    breaker = judge_trial(summary(status="failed", reason="stage timeout"), [], SLO, False, 0.1)
    assert breaker.hard_failure and "stage timeout" in breaker.why
    assert judge_trial(None, [], SLO, False, 0.1).hard_failure


def test_an_open_loop_trial_judges_ttft_from_the_intended_send_time() -> None:
    late = records([0.1] * 10, lag=0.6)
    assert judge_trial(summary(), late, SLO, False, 0.1).held
    assert not judge_trial(summary(), late, SLO, True, 0.1).held


def test_trial_sizes_follow_the_level() -> None:
    settings = Settings(limit=LimitSettings(requests_per_user=3, min_requests=8, trial_seconds=10.0))
    assert [trial_requests(settings, "limit_users", level) for level in (1, 2, 5)] == [8, 8, 15]
    assert [trial_requests(settings, "limit_rate", level) for level in (0.5, 2.5)] == [8, 25]


def test_limits_jsonl_round_trips_and_skips_torn_lines(tmp_path: Path) -> None:
    line = LimitLine(
        run_id="r", server="s", quant="Q8_0", experiment="limit_users", kind="users", workload="prompts",
        slo_ttft_p99_s=1.0, slo_tpot_s=0.1, limit=6.0, confirmed=True, ending="found", lowest_broken=7.0,
        seconds=120.0, sentence="6 users held", unix_s=1.0,
        trials=[TrialLine(level=6.0, held=True, hard_failure=False, seconds=10.0, why="ok", stage_id="x")],
    )  # fmt: skip
    path = tmp_path / "limits.jsonl"
    path.write_text(line.model_dump_json(by_alias=True) + "\n{torn\n")
    assert read_limits(path) == [line]
    assert read_limits(tmp_path / "absent.jsonl") == []


def test_the_run_plans_the_experiments_whose_input_is_there() -> None:
    settings = Settings()
    assert planned_experiments(settings) == [
        "sweep", "prefix_cache", "sessions", "mixed", "limit_users", "limit_rate", "kv_types"
    ]
    assert missing_input("open_loop", settings) == "no open-loop rate (load.rates_rps)"
    assert missing_input("trace", settings) == "no trace (trace.path)"
    both = Settings(load=LoadSettings(rates_rps=(1.0,)), trace=TraceSettings(path="t.jsonl"))
    assert "open_loop" in planned_experiments(both) and "trace" in planned_experiments(both)
    chosen = Settings(load=LoadSettings(experiments=("limit_users", "sweep")))
    assert planned_experiments(chosen) == ["limit_users", "sweep"]


def test_an_experiment_without_its_input_is_refused_in_one_line(tmp_path: Path) -> None:
    target = ServedTarget(name="s", url="http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="the trace experiment cannot run: no trace"):
        run_experiment("trace", target, Settings(), tmp_path, "run")
