"""A tune trial's rung: its time cap, size and level seconds.

One quantization's tune against fake servers with real Locust processes:
tests/integration/tune/test_tune_search_processes.py.
"""

from __future__ import annotations

from pathlib import Path

from tune_fakes import tune_context


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
    assert short.slo.level_max_s == 60.0  # the level's own seconds, within the cap: never too few to decide
    final = _trial_settings(settings, PlannedTrial("c0", last), left_s=100)
    assert (final.limit.time_cap_s, final.limit.requests_per_user, final.limit.min_requests) == (100, 6, 9)
    assert final.slo.level_max_s == 90.0
