"""The whole load path (plan -> Locust process -> records -> summaries) against the fake server.

Each test starts real Locust processes (a few seconds each) but asserts only on counts, classes
and causality, never on how fast anything was.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from load_api import context, run_open_loop, run_sweep, sweep_of
from quantload.cli.main import main as cli_main
from quantload.config import LoadSettings
from quantload.llamacpp.server import free_port
from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.load.processes import LoadProcess
from quantload.load.prompts import Prompt
from quantload.load.records import RequestRecord, StageEvent, iter_records, iter_stage_events
from quantload.load.supervisor import LoadError, run_plan
from quantload.served import ServedTarget

pytestmark = [pytest.mark.integration, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[3]

PROMPTS = [
    Prompt("p0", "plain one", 3),
    Prompt("p1", "two [[fake fault=http_503]]", 3),
    Prompt("p2", "three [[fake fault=cut_after:1]]", 3),
    Prompt("p3", "four [[fake fault=malformed_after:1]]", 3),
    Prompt("p4", "five [[fake fault=error_after:1]]", 3),
    Prompt("p5", "six", 3),
]


def served(name: str, quant: str, url: str) -> ServedTarget:
    return ServedTarget(name=name, quant=quant, model="m", url=url)


def settings(**changes: object) -> LoadSettings:
    base: dict[str, object] = dict(
        users=(1, 2), repeats=1, warmup_requests=1, max_tokens=4, request_timeout_s=10,
        first_round_jitter_s=0.01, metrics_port=0, stage_timeout_s=60,
    )  # fmt: skip
    base.update(changes)
    return LoadSettings.model_validate(base)


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    script = FakeScript(ttft_ms=(5, 20), itl_ms=(1, 3), tokens=4, close_after_stream=True)
    with FakeServer(script) as server:
        yield server


def records_of(run_dir: Path) -> list[RequestRecord]:
    return list(iter_records(run_dir / "records.jsonl"))


def stages_of(run_dir: Path) -> list[StageEvent]:
    return list(iter_stage_events(run_dir / "stages.jsonl"))


def test_sweep_records_every_request_and_fault(fake: FakeServer, tmp_path: Path) -> None:
    target = served("fake", "Q8_0", fake.url)
    seen: list[tuple[float, float | None]] = []
    summaries = run_sweep(
        target, settings(), tmp_path, "run-1", lambda d, t, n="": seen.append((d, t)), PROMPTS
    )
    records = records_of(tmp_path)
    measured = [r for r in records if not r.warmup]
    assert len(measured) == 12 and len(records) == 14
    assert {r.stage_users for r in measured} == {1, 2}
    classes = {r.prompt_id: r.error_class for r in measured if r.stage_users == 1}
    assert classes == {
        "p0": None, "p1": "http_5xx", "p2": "stream_cut", "p3": "malformed_chunk",
        "p4": "server_error_event", "p5": None,
    }  # fmt: skip
    for record in measured:
        assert record.run_id == "run-1" and record.server == "fake" and record.quant == "Q8_0"
        assert record.cache_prompt is False and record.connect_s is not None
        if record.ok:
            assert record.timings is not None and record.ttft_s is not None
            assert record.ttft_s * 1000 >= record.timings["prompt_ms"]  # never below the script
            assert record.completion_tokens == 4 and record.within_deadline
    events = stages_of(tmp_path)
    assert [(e.event, e.stage_users, e.status) for e in events] == [
        ("stage_start", 1, "ok"), ("stage_end", 1, "ok"), ("stage_start", 2, "ok"), ("stage_end", 2, "ok"),
    ]  # fmt: skip
    assert all(e.requests_planned == 6 for e in events)
    assert [s.ok for s in summaries] == [2, 2]
    assert [s.good for s in summaries] == [2, 2]
    assert summaries[0].errors == {
        "http_5xx": 1,
        "stream_cut": 1,
        "malformed_chunk": 1,
        "server_error_event": 1,
    }
    assert seen and seen[-1] == (12, 12)
    assert (tmp_path / "load-plans").is_dir() and list((tmp_path / "logs").glob("locust-sweep-*.log"))


def test_dead_target_trips_the_breaker_and_aborts_the_rest(tmp_path: Path) -> None:
    target = served("dead", "F16", f"http://127.0.0.1:{free_port()}")
    load = settings(users=(1, 2, 4), warmup_requests=0, max_consecutive_errors=3)
    summaries = run_sweep(target, load, tmp_path, "run-2", prompts=PROMPTS * 3)
    assert [s.status for s in summaries] == ["failed", "aborted", "aborted"]
    assert "in a row failed" in (summaries[0].reason or "")
    measured = [r for r in records_of(tmp_path) if not r.warmup]
    assert 3 <= len(measured) <= 4  # the breaker stopped the stage, at most one in flight more
    assert {r.error_class for r in measured} == {"connect_refused"}


def test_failed_warm_up_fails_the_stage(tmp_path: Path) -> None:
    target = served("dead", "F16", f"http://127.0.0.1:{free_port()}")
    summaries = run_sweep(target, settings(users=(1,)), tmp_path, "run-3", prompts=PROMPTS)
    assert [s.status for s in summaries] == ["failed"]
    assert (summaries[0].reason or "").startswith("warm-up failed")
    assert all(r.warmup for r in records_of(tmp_path))


def test_a_server_that_never_answers_costs_the_deadline_not_a_hang(tmp_path: Path) -> None:
    hang = [Prompt(f"h{i}", "[[fake fault=hang]]", 3) for i in range(10)]
    with FakeServer(FakeScript()) as server:
        target = served("hang", "F16", server.url)
        load = settings(users=(2,), warmup_requests=0, request_timeout_s=0.5, max_consecutive_errors=2)
        started = time.monotonic()
        summaries = run_sweep(target, load, tmp_path, "run-4", prompts=hang)
    assert time.monotonic() - started < 30
    assert summaries[0].status == "failed"
    assert {r.error_class for r in records_of(tmp_path)} == {"timeout"}


def test_open_loop_measures_from_the_intended_time(fake: FakeServer, tmp_path: Path) -> None:
    target = served("fake", "Q8_0", fake.url)
    load = settings(open_loop_requests=12, open_loop_users=4, warmup_requests=0)
    summaries = run_open_loop(target, load, tmp_path, "run-5", rates_rps=[20.0], prompts=PROMPTS[:1])
    assert [(s.experiment, s.rate_rps, s.users, s.status) for s in summaries] == [
        ("open_loop", 20.0, 4, "ok")
    ]
    records = records_of(tmp_path)
    assert len(records) == 12
    intended = [r.intended_unix_s for r in records]
    assert max(intended) - min(intended) > 0  # a schedule, not a burst
    for record in records:
        assert record.stage_rate_rps == 20.0 and record.experiment == "open_loop"
        assert record.ttft_s is not None and record.ttft_from_intended_s is not None
        assert record.ttft_from_intended_s == pytest.approx(record.ttft_s + record.lag_s)


def test_distributed_master_and_workers_produce_the_same_records(fake: FakeServer, tmp_path: Path) -> None:
    target = served("fake", "Q8_0", fake.url)
    load = settings(workers=2, users=(2,))
    summaries = run_sweep(target, load, tmp_path, "run-6", prompts=PROMPTS)
    assert [s.status for s in summaries] == ["ok"]
    records = records_of(tmp_path)
    assert len([r for r in records if not r.warmup]) == 6
    assert len({r.worker for r in records}) >= 1
    end = next(e for e in stages_of(tmp_path) if e.event == "stage_end")
    assert end.workers == 2 and end.requests_done == 6
    assert len(list((tmp_path / "logs").glob("locust-*-worker*.log"))) == 2


class CrashingProcess:
    """A layout whose one process exits with code 3 at once."""

    def processes(self, plan_path: Path, run_dir: Path, invocation: str) -> list[LoadProcess]:
        argv = (sys.executable, "-c", "import sys; sys.exit(3)")
        return [LoadProcess("local", argv, f"locust-{invocation}-local.log")]


def test_a_load_process_that_dies_leaves_aborted_stages(fake: FakeServer, tmp_path: Path) -> None:
    plan = sweep_of(settings(), served("fake", "F16", fake.url), PROMPTS, "run-7", "inv")
    with pytest.raises(LoadError, match="exit code 3"):
        run_plan(plan, context(tmp_path, settings()), layout=CrashingProcess())
    ends = [e for e in stages_of(tmp_path) if e.event == "stage_end"]
    assert [e.status for e in ends] == ["aborted", "aborted"]
    assert all("exit code 3" in (e.reason or "") for e in ends)


def test_cli_load_headless(fake: FakeServer, tmp_path: Path) -> None:
    code = cli_main([
        "load", "--url", fake.url, "--name", "fake", "--quant", "Q4_K_M", "--out", str(tmp_path),
        "--users", "1,2", "--repeats", "1", "--prompt-count", "3", "--max-tokens", "4",
        "--metrics-port", "0", "--run-id", "cli-run",
    ])  # fmt: skip
    assert code == 0
    summary = json.loads((tmp_path / "load-summary.json").read_text())
    assert [(s["users"], s["status"]) for s in summary] == [(1, "ok"), (2, "ok")]
    # each level sends its 3 requests, then the same again until it is decided: the fast fake meets
    assert all(s["ok"] >= 3 and s["level_outcome"] == "meets" for s in summary)
    assert {r.run_id for r in records_of(tmp_path)} == {"cli-run"}


def test_locustfile_interactive_mode_shows_ttft_and_tpot_and_serves_metrics(
    fake: FakeServer, tmp_path: Path
) -> None:
    port = free_port()
    scraped: list[str] = []
    stop = threading.Event()

    def scrape() -> None:
        while not stop.is_set():
            try:
                text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=1).text
                if "quantload_ttft_seconds_count" in text:
                    scraped.append(text)
            except httpx.HTTPError:
                pass
            time.sleep(0.3)

    thread = threading.Thread(target=scrape, daemon=True)
    thread.start()
    command = [
        sys.executable, "-m", "locust", "-f", str(REPO / "locustfiles" / "chat_stream.py"),
        "--headless", "-u", "2", "-r", "2", "-t", "6s", "--host", fake.url, "--only-summary",
        "--csv", str(tmp_path / "locust"), "--ql-server", "fake", "--ql-quant", "Q8_0",
        "--ql-out", str(tmp_path / "out"), "--ql-metrics-port", str(port),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path, check=False)
    stop.set()
    thread.join(5)
    assert done.returncode == 0, done.stderr[-2000:]
    stats = (tmp_path / "locust_stats.csv").read_text()
    assert ",TTFT," in stats and ",TPOT," in stats and "/v1/chat/completions" in stats
    records = records_of(tmp_path / "out")
    assert records and {r.experiment for r in records} == {"interactive"}
    assert scraped, "the load generator's /metrics never showed a TTFT observation"
    assert 'quantload_stage_info{experiment="interactive"' in scraped[-1]


def test_locustfile_distributed_workers_send_their_records_to_the_master(
    fake: FakeServer, tmp_path: Path
) -> None:
    master_port = free_port()
    locustfile = str(REPO / "locustfiles" / "chat_stream.py")
    common = ["--ql-server", "fake", "--ql-quant", "Q8_0", "--ql-metrics-port", "0"]
    master = subprocess.Popen(
        [
            sys.executable, "-m", "locust", "-f", locustfile, "--master", "--headless",
            "--master-bind-host", "127.0.0.1", "--master-bind-port", str(master_port),
            "--expect-workers", "1", "-u", "2", "-r", "2", "-t", "5s", "--host", fake.url,
            "--only-summary", "--ql-out", str(tmp_path / "out"), *common,
        ],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    worker = subprocess.Popen(
        [
            sys.executable, "-m", "locust", "-f", locustfile, "--worker", "--master-host", "127.0.0.1",
            "--master-port", str(master_port), *common,
        ],
        cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        _, err = master.communicate(timeout=90)
        worker.wait(30)
    finally:
        for process in (master, worker):
            if process.poll() is None:
                process.kill()
                process.wait(5)
    assert master.returncode == 0, err[-2000:]
    records = records_of(tmp_path / "out")
    assert any(r.ok for r in records)
    assert all(r.ok or r.error_class == "aborted" for r in records)  # -t ends users mid-request
    assert {r.worker for r in records} == {f"{r.worker.split(':')[0]}:{worker.pid}" for r in records[:1]}
