"""The limit search for real (Locust processes, trial after trial) against the fake server with a
scripted capacity, and the bounds the load says before it starts: more users than requests, a
prompt count beyond the set."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from load_api import settings_context
from quantload.config import LimitSettings, LoadSettings, Settings, SloSettings
from quantload.experiments.registry import run_experiment
from quantload.load.fakeserver import FakeScript, FakeServerProcess
from quantload.load.limit_file import read_limits
from quantload.served import ServedTarget

pytestmark = [pytest.mark.integration, pytest.mark.slow]

# Each stream: 20 ms to the first token, then 20 tokens 8 ms apart (~0.18 s). With 3 streams at a
# time, a fourth user waits a whole stream for its turn: about one request in four has a TTFT near
# 0.2 s against a limit of 0.15 s. A p90 objective keeps the decisions quick: up to 3 users no
# request is over the limit (meets after a few dozen requests a user), from 4 a quarter are (misses).
CAPACITY = FakeScript(
    ttft_ms=(20.0, 20.0), itl_ms=(8.0, 8.0), tokens=20, max_streams=3, close_after_stream=True, pathological=False
)
SLO = SloSettings(
    ttft_s=0.15, tpot_s=0.05, ttft_percentile="p90", tpot_percentile="p90", max_failed_frac=0.1, level_max_s=30.0
)


def search_settings(**limit: object) -> Settings:
    # the fake's scripted waits decide here, not other work on a busy test machine
    return Settings(
        load=LoadSettings(
            metrics_port=0, warmup_requests=1, request_timeout_s=20, first_round_jitter_s=0.005,
            interference_cpu_frac=1.0,
        ),
        limit=LimitSettings.model_validate(
            {"max_users": 16, "requests_per_user": 3, "min_requests": 6, "time_cap_s": 240, **limit}
        ),
        slo=SLO,
    )


def test_the_search_finds_the_scripted_number_of_streams(tmp_path: Path) -> None:
    with FakeServerProcess(CAPACITY) as fake:
        target = ServedTarget(name="fake", quant="Q4_K_M", model="m", url=fake.url)
        done = run_experiment("limit_users", target, settings_context(tmp_path, search_settings(), "search"))
    assert done.limit is not None and done.problem is None
    assert done.limit.limit == 3.0 and done.limit.ending == "found"
    assert done.limit.lowest_miss == 4.0 and done.limit.undecided == []
    levels = [t.level for t in done.limit.trials]
    assert levels == [1.0, 2.0, 4.0, 3.0]  # grow x2 until a level misses, then bisect down to 3
    assert [t.outcome for t in done.limit.trials] == ["meets", "meets", "misses", "meets"]
    assert [line.limit for line in read_limits(tmp_path / "limits.jsonl")] == [3.0]
    assert {s.experiment for s in done.summaries} == {"limit_users"}
    assert "3 users met the SLO; misses from 4" in done.limit.sentence
    at_three, at_four = (next(s for s in done.summaries if s.users == n) for n in (3, 4))
    assert at_four.requests < at_three.requests / 2  # a broken level stops long before a good one


def test_the_time_cap_ends_a_search_early(tmp_path: Path) -> None:
    with FakeServerProcess(CAPACITY) as fake:
        target = ServedTarget(name="fake", quant="Q4_K_M", model="m", url=fake.url)
        capped = settings_context(tmp_path, search_settings(time_cap_s=1.0), "capped")
        done = run_experiment("limit_users", target, capped)
    assert done.limit is not None and done.limit.ending == "capped" and len(done.limit.trials) == 1
    assert "time cap" in done.limit.sentence


@pytest.mark.long  # a whole rate search, about a minute (the users search stays in make test): `make test-long`
def test_the_rate_search_finds_the_scripted_rate_limit(tmp_path: Path) -> None:
    script = FakeScript(
        ttft_ms=(10.0, 10.0), itl_ms=(2.0, 2.0), tokens=4, rate_limit_rps=8.0, close_after_stream=True,
        pathological=False,
    )  # fmt: skip
    settings = search_settings(start_rate_rps=4.0, max_rate_rps=64.0, trial_seconds=4.0, rate_resolution=0.3)
    settings = settings.model_copy(update={"slo": SLO.model_copy(update={"level_max_s": 12.0})})
    with FakeServerProcess(script) as fake:
        target = ServedTarget(name="fake", quant="Q8_0", model="m", url=fake.url)
        done = run_experiment("limit_rate", target, settings_context(tmp_path, settings, "rate"))
    found = done.limit
    assert found is not None and found.kind == "rate_rps" and found.limit is not None
    # above 8 req/s the queue grows for the whole trial; at or below it TTFT stays near 10 ms
    assert 4.0 <= found.limit <= 8.5 and found.lowest_miss is not None and found.lowest_miss > 8.0


def run_cli(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "quantload.cli.main", *args], cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_the_load_says_what_a_stage_cannot_measure_before_it_starts(tmp_path: Path) -> None:
    script = FakeScript(ttft_ms=(5.0, 5.0), itl_ms=(1.0, 1.0), tokens=4, close_after_stream=True)
    with FakeServerProcess(script) as fake:
        result = run_cli(
            ["load", "--url", fake.url, "--out", str(tmp_path / "out"), "--users", "6", "--repeats", "1",
             "--prompt-count", "4", "--max-tokens", "4", "--metrics-port", "0"],
            tmp_path,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-2000:]
        warning = "6 users but only 4 requests: at most 4 can be in flight at once"
        assert warning in result.stderr
        cycled = run_cli(
            ["load", "--url", fake.url, "--out", str(tmp_path / "cycled"), "--users", "2", "--repeats", "1",
             "--prompt-count", "103", "--max-tokens", "2", "--metrics-port", "0"],
            tmp_path,
        )  # fmt: skip
    assert cycled.returncode == 0, cycled.stderr[-2000:]
    assert "103 requests asked of the 100 prompts of builtin" in cycled.stderr
    lines = (tmp_path / "cycled" / "records.jsonl").read_text().splitlines()
    ids = [json.loads(line)["prompt_id"] for line in lines if not json.loads(line)["warmup"]]
    # the stage sends its 103 requests, then the same again while its level is undecided
    assert len(ids) >= 103 and len(set(ids)) == 103 and sum(i.endswith("#2") for i in set(ids)) == 3
    stage = [json.loads(line) for line in (tmp_path / "out" / "stages.jsonl").read_text().splitlines()]
    assert warning in (stage[0]["warning"] or "")
