"""The tune tests' shared pieces: a target, the fake's script, a quick SLO and a run context for a
tune of a small space (importable as `tune_fakes`: pytest puts tests/ on sys.path). Used by
tests/unit/tune and tests/integration/tune."""

from __future__ import annotations

from pathlib import Path

from load_api import context
from quantload.config import LoadSettings
from quantload.load.fakeserver import FakeScript
from quantload.run_context import RunContext
from quantload.served import ServedTarget

TARGET = ServedTarget(name="llama-q8_0", quant="Q8_0", model="m", url="http://127.0.0.1:1")
SCRIPT = FakeScript(ttft_ms=(2, 5), itl_ms=(1, 2), tokens=6, close_after_stream=True)


def tune_context(tmp_path: Path, **tune: object) -> RunContext:
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
