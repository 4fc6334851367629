"""The load's failure paths with real processes (issue 16, items 1 and 7): `quantload load` refuses
a bad URL before any process starts; an exception in a load process ends the stage at once with
its cause on the console; a taken /metrics port is said on the console.

Real Locust processes against the fake server, on loopback; every test is bounded well below the
stage timeout it sets, so "ended at once" and "waited out the timeout" cannot be confused.

Moved from tests/unit/load/test_load_failures.py, whose other tests start no process.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from load_api import context, sweep_of
from quantload.config import LoadSettings
from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.load.processes import LoadProcess, LocustProcesses
from quantload.load.prompts import Prompt
from quantload.load.records import StageEvent, iter_records, iter_stage_events
from quantload.load.supervisor import LoadError, run_plan
from quantload.served import ServedTarget
from support import clean_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]
STAGE_TIMEOUT_S = 120.0  # what a hang would cost; every test here must end long before
PROMPTS = [Prompt("p0", "one", 2), Prompt("p1", "two", 2)]


def settings(**changes: object) -> LoadSettings:
    base: dict[str, object] = dict(
        users=(1,), repeats=1, warmup_requests=0, max_tokens=3, request_timeout_s=10,
        first_round_jitter_s=0.0, metrics_port=0, stage_timeout_s=STAGE_TIMEOUT_S, workers=0,
    )  # fmt: skip
    base.update(changes)
    return LoadSettings.model_validate(base)


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    with FakeServer(FakeScript(ttft_ms=(2, 5), itl_ms=(1, 2), tokens=3)) as server:
        yield server


def stage_ends(run_dir: Path) -> list[StageEvent]:
    return [e for e in iter_stage_events(run_dir / "stages.jsonl") if e.event == "stage_end"]


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://user@:80"])
def test_quantload_load_refuses_a_bad_url_before_any_process_starts(url: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    command = [sys.executable, "-m", "quantload.cli.main", "load", "--url", url, "--out", str(out),
               "--users", "1", "--prompt-count", "1", "--repeats", "1", "--metrics-port", "0"]  # fmt: skip
    done = subprocess.run(command, env=clean_env(), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), lines
    assert "port" in lines[0] or "host" in lines[0], lines
    assert not list(out.glob("logs/locust-*"))  # no load process was started


def test_an_exception_in_the_load_process_ends_the_stage_at_once_with_its_cause(
    fake: FakeServer, tmp_path: Path
) -> None:
    plan = sweep_of(settings(), ServedTarget(name="fake", url=fake.url), PROMPTS, "run", "inv")
    # A request body the client cannot write (orjson refuses integers beyond 64 bits): the
    # exception is raised inside the Locust process, in the user's greenlet.
    params = plan.params.model_copy(update={"extra_body": {"n_probs": 2**70}})
    broken = plan.model_copy(update={"params": params})
    started = time.monotonic()
    summaries = run_plan(broken, context(tmp_path, settings())).summaries
    took_s = time.monotonic() - started
    assert took_s < STAGE_TIMEOUT_S / 3, f"the stage waited {took_s:.0f} s"
    assert [s.status for s in summaries] == ["failed"]
    reason = summaries[0].reason or ""
    assert "the load client failed" in reason and "64-bit" in reason, reason
    records = list(iter_records(tmp_path / "records.jsonl"))
    assert records and records[0].error_class == "client_error"


class _WithArgs:
    """The real Locust layout with one process's command line changed by `edit`."""

    def __init__(self, workers: int, edit_role: str, extra: tuple[str, ...]) -> None:
        self.layout = LocustProcesses(workers, "127.0.0.1", 0)
        self.edit_role = edit_role
        self.extra = extra

    def processes(self, plan_path: Path, run_dir: Path, invocation: str) -> list[LoadProcess]:
        specs = self.layout.processes(plan_path, run_dir, invocation)
        return [replace(s, argv=(*s.argv, *self.extra)) if s.role == self.edit_role else s for s in specs]


def test_a_load_process_that_cannot_read_its_plan_says_why(fake: FakeServer, tmp_path: Path) -> None:
    plan = sweep_of(settings(), ServedTarget(name="fake", url=fake.url), PROMPTS, "run", "inv")
    broken_plan = tmp_path / "broken-plan.json"
    broken_plan.write_text('{"run_id": "run"}')
    layout = _WithArgs(0, "local", ("--plan", str(broken_plan)))  # the last --plan wins
    started = time.monotonic()
    with pytest.raises(LoadError) as failed:
        run_plan(plan, context(tmp_path, settings()), layout=layout)
    assert time.monotonic() - started < STAGE_TIMEOUT_S / 3
    message = failed.value.one_line()
    assert "ValidationError" in message and "locust-inv-local.log" in message, message
    assert [e.status for e in stage_ends(tmp_path)] == ["aborted"]
    assert "ValidationError" in (stage_ends(tmp_path)[0].reason or "")


def test_a_worker_that_dies_ends_the_load_at_once(fake: FakeServer, tmp_path: Path) -> None:
    plan = sweep_of(settings(), ServedTarget(name="fake", url=fake.url), PROMPTS, "run", "inv")
    layout = _WithArgs(1, "worker", ("--metrics-port", "not-a-port"))
    started = time.monotonic()
    with pytest.raises(LoadError) as failed:
        run_plan(plan, context(tmp_path, settings(workers=1)), layout=layout)
    took_s = time.monotonic() - started
    assert took_s < 40, f"took {took_s:.0f} s (the master waits 60 s for its workers)"
    assert "(worker)" in failed.value.one_line() and "not-a-port" in failed.value.one_line()


def test_a_taken_metrics_port_is_said_on_the_console(fake: FakeServer, tmp_path: Path) -> None:
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        command = [sys.executable, "-m", "quantload.cli.main", "load", "--url", fake.url,
                   "--out", str(tmp_path / "out"), "--users", "1", "--prompt-count", "2", "--repeats", "1",
                   "--max-tokens", "3", "--metrics-port", str(port), "--workers", "0"]  # fmt: skip
        done = subprocess.run(command, env=clean_env(), cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"127.0.0.1:{port}" in done.stderr and "Prometheus will miss" in done.stderr, done.stderr[-2000:]
