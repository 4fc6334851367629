"""A tune trial's rung: its time cap, size and level seconds.

One quantization's tune against fake servers with real Locust processes:
tests/integration/tune/test_tune_search_processes.py.
"""

from __future__ import annotations

from pathlib import Path

from load_api import context
from quantload.config import LoadSettings


def tune_context(tmp_path: Path, **tune: object):  # type: ignore[no-untyped-def]
    load = LoadSettings.model_validate(
        {
            "warmup_requests": 0,
            "request_timeout_s": 10,
            "first_round_jitter_s": 0.01,
            "metrics_port": 0,
            "max_tokens": 6,
            "prompt_count": 4,
        }
    )
    space = {
        "slots": [2, 4],
        "batch_sizes": ["2048/512"],
        "cache_types": ["f16"],
        "finalists": 1,
        "eta": 2,
        "short_trial_s": 30,
        "budget_s": 600,
        **tune,
    }
    return context(
        tmp_path,
        load,
        tune=space,
        slo=QUICK_SLO,
        limit={"max_users": 2, "requests_per_user": 1, "min_requests": 2},
    )


# a median objective decides a level in a few requests, so a tune of the fake takes seconds
QUICK_SLO = {
    "ttft_s": 30.0, "tpot_s": 5.0, "ttft_percentile": "p50", "tpot_percentile": "p50", "max_failed_frac": 0.5,
    "level_max_s": 5.0,
}  # fmt: skip


def test_a_trial_takes_its_rungs_time_cap_size_and_level_seconds(tmp_path: Path) -> None:
    from quantload.tune.halving import PlannedTrial, plan_rungs
    from quantload.tune.search import _trial_settings

    run = tune_context(tmp_path)
    limit = run.settings.limit.model_copy(update={"requests_per_user": 6, "min_requests": 9})
    settings = run.settings.model_copy(
        update={"limit": limit, "slo": run.settings.slo.model_copy(update={"level_max_s": 90.0})}
    )
    first, last = plan_rungs(8, 3, 2, 60, 300)[0], plan_rungs(8, 3, 2, 60, 300)[-1]
    short = _trial_settings(settings, PlannedTrial("c0", first), left_s=1000)
    assert (short.limit.time_cap_s, short.limit.requests_per_user, short.limit.min_requests) == (60, 1, 2)
    assert short.slo.level_max_s == 10.0
    final = _trial_settings(settings, PlannedTrial("c0", last), left_s=100)
    assert (final.limit.time_cap_s, final.limit.requests_per_user, final.limit.min_requests) == (100, 6, 9)
    assert final.slo.level_max_s == 90.0
