"""A limit-search trial judged against the SLO, trial sizes, limits.jsonl, and which experiments a
run plans from its settings."""

from __future__ import annotations

from pathlib import Path

import pytest
from rich.console import Console

from load_api import context
from quantload.cli.context import CliContext
from quantload.config import LimitSettings, LoadSettings, Settings, TraceSettings
from quantload.errors import ConfigError
from quantload.experiments import registry
from quantload.experiments.limit_trials import judge_trial, trial_requests
from quantload.experiments.registry import run_experiment
from quantload.experiments.sweep import requests_per_stage
from quantload.load.limit_file import LimitLine, TrialLine, read_limits
from quantload.load.prompts import Prompt
from quantload.load.records import RequestRecord, StageEvent
from quantload.load.summary import StageSummary, summarize_stage
from quantload.load.workloads import PromptSetWorkload
from quantload.served import ServedTarget
from quantload.slo import Slo

SLO = Slo(ttft_s=0.5, tpot_s=0.05)


def records(ttft: list[float], tpot: float = 0.01, lag: float = 0.0, failed: int = 0) -> list[RequestRecord]:
    out = []
    for index, value in enumerate(ttft):
        ok = index >= failed
        out.append(
            RequestRecord(
                run_id="r", server="s", quant="q", model="m", url="http://x", experiment="limit_users",
                stage_id="st", cache_prompt=False, prompt_id="p", worker="w", intended_unix_s=0.0,
                sent_unix_s=float(index), lag_s=lag, ttft_s=value if ok else None,
                ttft_from_intended_s=value + lag if ok else None, tpot_s=tpot if ok else None,
                e2e_s=value + 0.1 if ok else None, ok=ok, within_deadline=ok,
            )
        )
    return out


def summary(trial: list[RequestRecord], open_loop: bool = False, **end: object) -> StageSummary:
    """The trial stage's summary as the supervisor writes it."""
    line = StageEvent.model_validate(
        {
            "event": "stage_end", "unix_s": 1.0, "run_id": "r", "server": "s", "quant": "q",
            "experiment": "limit_rate" if open_loop else "limit_users", "stage_id": "st", "stage_index": 0,
            "stage_users": 4, "stage_rate_rps": 2.0 if open_loop else None,
            "arrival": "poisson" if open_loop else "closed", "cache_prompt": False,
            "requests_planned": len(trial), **end,
        }
    )  # fmt: skip
    return summarize_stage(line, trial, SLO)


def test_a_trial_of_few_clean_requests_is_undecided_and_says_what_it_rests_on() -> None:
    verdict = judge_trial(summary(records([0.1] * 10)), SLO, 0.1)
    assert verdict.outcome == "undecided" and not verdict.hard_failure and "TTFT p99 100 ms" in verdict.why
    assert verdict.requests == 10 and "rests on 10 requests" in verdict.sureness
    assert "more requests would likely decide it" in verdict.sureness


def test_enough_clean_requests_meet_and_a_broken_level_misses() -> None:
    met = judge_trial(summary(records([0.1] * 2400)), SLO, 0.1)  # four users in flight: bursts of four
    assert met.outcome == "meets" and "at most" in met.sureness
    broken = judge_trial(summary(records([2.0] * 10)), SLO, 0.1)
    assert broken.outcome == "misses" and not broken.hard_failure
    assert "10 of 10 requests over the TTFT limit" in broken.why and "more than 1.0 %" in broken.sureness


def test_a_slow_decode_misses_softly_and_failures_miss_hard() -> None:
    tpot = judge_trial(summary(records([0.1] * 10, tpot=0.2)), SLO, 0.1)
    assert tpot.outcome == "misses" and "10 of 10 requests over the TPOT limit" in tpot.why
    errors = judge_trial(summary(records([0.1] * 10, failed=2)), SLO, 0.1)
    assert errors.hard_failure and "2 of 10 requests failed" in errors.why
    breaker = judge_trial(summary(records([0.1] * 4), status="failed", reason="stage timeout"), SLO, 0.1)
    assert breaker.hard_failure and "stage timeout" in breaker.why
    assert judge_trial(None, SLO, 0.1).hard_failure


def test_an_open_loop_trial_judges_ttft_from_the_intended_send_time() -> None:
    late = records([0.1] * 10, lag=0.6)
    assert judge_trial(summary(late), SLO, 0.1).outcome == "undecided"
    assert judge_trial(summary(late, open_loop=True), SLO, 0.1).outcome == "misses"


def test_trial_sizes_follow_the_level() -> None:
    settings = Settings(limit=LimitSettings(requests_per_user=3, min_requests=8, trial_seconds=10.0))
    assert [trial_requests(settings, "limit_users", level) for level in (1, 2, 5)] == [8, 8, 15]
    assert [trial_requests(settings, "limit_rate", level) for level in (0.5, 2.5)] == [8, 25]


def test_limits_jsonl_round_trips_and_skips_torn_lines(tmp_path: Path) -> None:
    line = LimitLine(
        run_id="r", server="s", quant="Q8_0", experiment="limit_users", kind="users", workload="prompts",
        slo_ttft_s=1.0, slo_tpot_s=0.1, limit=6.0, ending="found", lowest_miss=7.0, undecided=[],
        seconds=120.0, sentence="6 users met the SLO", unix_s=1.0,
        trials=[TrialLine(level=6.0, outcome="meets", hard_failure=False, seconds=10.0, why="ok", stage_id="x")],
    )  # fmt: skip
    path = tmp_path / "limits.jsonl"
    path.write_text(line.model_dump_json(by_alias=True) + "\n{torn\n")
    assert read_limits(path) == [line]
    assert read_limits(tmp_path / "absent.jsonl") == []


def test_a_limits_line_of_the_first_schema_reads_as_meets_and_misses(tmp_path: Path) -> None:
    old = (
        '{"schema": "quantload.limit/1", "run_id": "r", "server": "s", "quant": "Q8_0",'
        ' "experiment": "limit_users", "kind": "users", "workload": "prompts", "slo_ttft_p99_s": 1.0,'
        ' "slo_tpot_s": 0.1, "limit": 2.0, "confirmed": true, "ending": "found", "lowest_broken": 3.0,'
        ' "seconds": 9.0, "sentence": "x", "unix_s": 1.0, "trials": [{"level": 2.0, "held": true,'
        ' "hard_failure": false, "seconds": 1.0, "why": ""}, {"level": 3.0, "held": false,'
        ' "hard_failure": false, "seconds": 1.0, "why": ""}]}'
    )
    (tmp_path / "limits.jsonl").write_text(old + "\n")
    (line,) = read_limits(tmp_path / "limits.jsonl")
    assert [t.outcome for t in line.trials] == ["meets", "misses"]
    assert (line.slo_ttft_s, line.lowest_miss) == (1.0, 3.0)


def planned(settings: Settings) -> list[str]:
    return [experiment.name for experiment in registry.planned(settings)]


def test_the_run_plans_the_experiments_whose_input_is_there() -> None:
    settings = Settings()
    assert planned(settings) == [
        "sweep", "prefix_cache", "sessions", "mixed", "limit_users", "limit_rate", "context", "kv_types"
    ]  # noisy_neighbour needs two [[tenants]]
    assert registry.missing_input("open_loop", settings) == "no open-loop rate (load.rates_rps)"
    assert registry.missing_input("trace", settings) == "no trace (trace.path)"
    both = Settings(load=LoadSettings(rates_rps=(1.0,)), trace=TraceSettings(path="t.jsonl"))
    assert "open_loop" in planned(both) and "trace" in planned(both)
    chosen = Settings(load=LoadSettings(experiments=("limit_users", "sweep")))
    assert planned(chosen) == ["limit_users", "sweep"]


def test_an_experiment_without_its_input_is_refused_in_one_line(tmp_path: Path) -> None:
    target = ServedTarget(name="s", url="http://127.0.0.1:1")
    with pytest.raises(ConfigError, match="the trace experiment cannot run: no trace"):
        run_experiment("trace", target, context(tmp_path))


def test_load_experiments_names_only_the_registry_s_experiments_once(tmp_path: Path) -> None:
    asked = Settings(load=LoadSettings(experiments=("swep",)))  # the settings leave names to the registry
    with pytest.raises(ConfigError, match=r"'load\.experiments': unknown experiment 'swep'"):
        registry.requested_names(asked)
    with pytest.raises(ConfigError, match=r"unknown experiment 'swep'$"):
        CliContext(tmp_path, {"QUANTLOAD_LOAD__EXPERIMENTS": "sweep,swep"}, None, Console(), Console()).config()
    with pytest.raises(ValueError, match="lists sweep more than once"):
        LoadSettings(experiments=("sweep", "sweep"))
    assert LoadSettings().experiments is None
    listed = CliContext(tmp_path, {"QUANTLOAD_LOAD__EXPERIMENTS": "sweep,soak"}, None, Console(), Console())
    assert listed.config().settings.load.experiments == ("sweep", "soak")
    assert registry.requested_names(Settings()) == registry.default_names()
    named_only = [name for name in registry.names() if name not in registry.default_names()]
    assert named_only == ["batching", "slots", "speculation", "ramp_up"]  # they run when load.experiments names them


def test_a_trial_sends_at_least_what_a_sweep_stage_sends_unless_told_fewer() -> None:
    settings = Settings(load={"prompt_count": 100}, limit=LimitSettings(requests_per_user=4))
    assert settings.limit.min_requests is None
    assert [trial_requests(settings, "limit_users", level) for level in (1, 8, 32)] == [100, 100, 128]
    assert trial_requests(settings, "limit_rate", 0.5) == 100
    synthetic = Settings(workload={"kind": "lengths", "requests": 40}, limit=LimitSettings(requests_per_user=4))
    assert trial_requests(synthetic, "limit_users", 1) == 40
    told = Settings(load={"prompt_count": 100}, limit=LimitSettings(requests_per_user=4, min_requests=8))
    assert trial_requests(told, "limit_users", 1) == 8


def test_where_a_trial_meets_a_sweep_level_it_sends_the_sweep_stages_prompts() -> None:
    prompts = [Prompt(f"p{i}", f"text {i}", 10 + i) for i in range(30)]
    workload = PromptSetWorkload(prompts)
    settings = Settings(load={"prompt_count": 30})
    trial = workload.stage_requests(trial_requests(settings, "limit_users", 2), settings.load.seed + 3, "t-")
    sweep = workload.stage_requests(requests_per_stage(settings), settings.load.seed, "s-")
    assert [r.prompt_id for r in trial.requests] == [r.prompt_id for r in sweep.requests]
