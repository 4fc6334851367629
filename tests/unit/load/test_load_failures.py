"""The load's failure paths that need no process (issue 16, items 1 and 7): a bad URL is refused in
one line, the plan's target is checked before any process, and a failed process's cause is read
from its log.

Its tests that start processes: tests/integration/load/test_load_failures_processes.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from load_api import context, sweep_of
from quantload.config import LoadSettings
from quantload.errors import ConfigError
from quantload.load.client import Endpoint, EndpointError
from quantload.load.plan import LoadPlan
from quantload.load.prompts import Prompt
from quantload.load.supervisor import LoadError, failure_cause, run_plan
from quantload.served import ServedTarget

BAD_URLS = [
    "http://127.0.0.1:99999",
    "http://127.0.0.1:abc",
    "http://127.0.0.1:0",
    "http://",
    "http://[::1",
    "http://user@:8080",
    "ftp://127.0.0.1:8080",
    "127.0.0.1:8080",
]
STAGE_TIMEOUT_S = 120.0  # what a hang would cost; every test here must end long before
PROMPTS = [Prompt("p0", "one", 2), Prompt("p1", "two", 2)]


def settings(**changes: object) -> LoadSettings:
    base: dict[str, object] = dict(
        users=(1,), repeats=1, warmup_requests=0, max_tokens=3, request_timeout_s=10,
        first_round_jitter_s=0.0, metrics_port=0, stage_timeout_s=STAGE_TIMEOUT_S, workers=0,
    )  # fmt: skip
    base.update(changes)
    return LoadSettings.model_validate(base)


@pytest.mark.parametrize("url", BAD_URLS)
def test_a_bad_url_is_refused_in_one_line(url: str) -> None:
    with pytest.raises(ConfigError) as refused:
        ServedTarget(name="s", url=url)
    assert "\n" not in refused.value.one_line() and url in refused.value.one_line()
    with pytest.raises(EndpointError):
        Endpoint.from_url(url)


def test_failure_cause_reads_the_marker_else_the_last_line(tmp_path: Path) -> None:
    log = tmp_path / "a.log"
    log.write_text("starting\nquantload load process failed: KeyError: 'x'\nbye\n")
    assert failure_cause(log, 1) == "KeyError: 'x'"
    log.write_text("Traceback (most recent call last):\n  ...\nRuntimeError: boom\n")
    assert failure_cause(log, 1) == "RuntimeError: boom (exit code 1)"
    assert failure_cause(tmp_path / "missing.log", 7) == "exit code 7"


def test_the_plan_target_is_checked_before_any_process(tmp_path: Path) -> None:
    plan = sweep_of(settings(), ServedTarget(name="s", url="http://127.0.0.1:8080"), PROMPTS, "run", "inv")
    target = ServedTarget.model_construct(name="s", quant="", model="", url="http://127.0.0.1:99999")
    broken = LoadPlan.model_construct(**{**dict(plan), "target": target})
    with pytest.raises(LoadError, match="99999"):
        run_plan(broken, context(tmp_path, settings()))
    assert not (tmp_path / "logs").exists()
