"""`quantload calibrate`: the errors it computes, its verdict, and a short real run against the fake."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from quantload.cli.main import main as cli_main
from quantload.config import CalibrateSettings, LoadSettings
from quantload.load.calibrate import (
    MIN_REQUESTS,
    SCRIPT,
    CalibrationError,
    RemoteFake,
    calibration_script,
    count_result,
    requests_for,
    run_calibration,
)
from quantload.load.calibration_file import (
    LATEST_JSON,
    SCHEMA,
    Calibration,
    CountResult,
    trusted_streams,
    write_calibration,
)
from quantload.load.fakeserver import FakeServerProcess
from quantload.load.records import RequestRecord
from support import clean_env

BASE = dict(
    run_id="cal", server="fake", quant="none", model="fake", url="http://127.0.0.1:1",
    experiment="sweep", stage_id="s-0", cache_prompt=False, prompt_id="p", worker="h:1",
    intended_unix_s=1.0, sent_unix_s=1.0, lag_s=0.0, within_deadline=True,
)  # fmt: skip


def record(
    ttft_s: float, itl_s: list[float], prompt_ms: float, gap_ms: float, late_ms: float, read_s: float = 0.0
) -> RequestRecord:
    timings = {
        "prompt_ms": prompt_ms,
        "predicted_per_token_ms": gap_ms,
        "first_token_late_ms": late_ms,
        "request_received_unix_s": 1.0 + read_s,  # BASE's sent_unix_s, plus the fake's read delay
    }
    return RequestRecord.model_validate(
        {**BASE, "ok": True, "ttft_s": ttft_s, "itl_s": itl_s, "timings": timings, "e2e_s": 1.0}
    )


def count(streams: int, within: bool) -> CountResult:
    return CountResult(
        streams=streams, workers=0, requests=10, ok=10, ttft_error_p50_s=0.001, ttft_error_p99_s=0.002,
        ttft_error_vs_script_p99_s=0.003, itl_error_p50_s=0.0, itl_error_p99_s=0.001,
        server_token_late_p99_s=0.001, delivered_concurrency=float(streams), client_cpu_frac=0.5,
        client_cpu_per_100_streams=0.5, within_error=within,
    )  # fmt: skip


def test_errors_are_measured_minus_what_the_fake_delivered() -> None:
    # scripted TTFT 100 ms, the fake sent it 2 ms late, the client saw it at 103 ms: own error 1 ms
    records = [record(0.103, [0.0105, 0.0095], prompt_ms=100, gap_ms=10, late_ms=2)] * 10
    result = count_result(4, 0, records, None, None, 2.0, max_error_p99_s=0.005)
    assert result.ttft_error_p50_s == pytest.approx(0.001)
    assert result.ttft_error_vs_script_p99_s == pytest.approx(0.003)
    assert result.itl_error_p99_s == pytest.approx(0.0005, abs=1e-9)
    assert result.itl_error_p50_s == pytest.approx(0.0, abs=1e-9)
    assert result.server_token_late_p99_s == pytest.approx(0.002)
    assert result.within_error and result.requests == result.ok == 10
    assert not count_result(4, 0, records, None, None, None, max_error_p99_s=0.0005).within_error
    # the fake took 1.5 ms to read the request: its delay, not the client's
    slow_reader = [record(0.1045, [0.010], prompt_ms=100, gap_ms=10, late_ms=2, read_s=0.0015)]
    assert count_result(1, 0, slow_reader, None, None, None, 0.005).ttft_error_p50_s == pytest.approx(0.001)


def test_a_failed_request_or_a_late_gap_is_not_within_the_error() -> None:
    good = record(0.101, [0.010], prompt_ms=100, gap_ms=10, late_ms=0)
    failed = RequestRecord.model_validate({**BASE, "ok": False, "error_class": "timeout"})
    assert not count_result(1, 0, [good, failed], None, None, None, 0.005).within_error
    late_gap = record(0.101, [0.030], prompt_ms=100, gap_ms=10, late_ms=0)
    assert not count_result(1, 0, [late_gap], None, None, None, 0.005).within_error
    assert not count_result(1, 0, [], None, None, None, 0.005).within_error


def test_the_answer_is_the_largest_count_up_to_which_every_count_was_right() -> None:
    assert trusted_streams((count(1, True), count(8, True), count(64, False), count(256, True))) == 8
    assert trusted_streams((count(1, False), count(8, True))) is None
    assert trusted_streams((count(1, True), count(8, True))) == 8


def test_requests_cover_the_time_asked_with_a_floor() -> None:
    assert requests_for(1, 1.0) == MIN_REQUESTS
    assert requests_for(256, 5.0) > 256 * 10
    assert requests_for(1000, 0.01) == 2000


@pytest.mark.slow
def test_calibrate_against_the_fake_writes_a_linkable_result(tmp_path: Path) -> None:
    settings = CalibrateSettings(streams=(4, 16), seconds_per_count=0.5, max_error_p99_s=10.0)
    seen: list[tuple[float, float | None]] = []
    result = run_calibration(settings, LoadSettings(workers=0), lambda d, t, n="": seen.append((d, t)))
    assert [c.streams for c in result.counts] == [4, 16]
    for found in result.counts:
        assert found.requests >= MIN_REQUESTS and found.ok == found.requests
        assert found.ttft_error_p99_s is not None and found.itl_error_p99_s is not None
        assert found.ttft_error_vs_script_p99_s is not None
        assert found.ttft_error_vs_script_p99_s >= (found.ttft_error_p50_s or 0.0)
        assert found.client_cpu_per_100_streams is not None and found.client_cpu_per_100_streams > 0
        assert found.delivered_concurrency is not None and found.workers == 0
    assert result.trusted_streams == 16  # a 10 s bound: every count is within it
    assert result.fake_closes_connections and result.cores >= 1
    assert seen[-1] == (sum(c.requests for c in result.counts),) * 2
    path = write_calibration(result, tmp_path / "calibration")
    assert path.name.startswith("calibration-") and path.suffix == ".json"
    stored = json.loads((tmp_path / "calibration" / LATEST_JSON).read_text())
    assert stored["schema_version"] == SCHEMA and stored == json.loads(path.read_text())
    assert Calibration.model_validate(stored) == result


@pytest.mark.slow
def test_cli_calibrate_prints_its_verdict_and_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli_main([
        "calibrate", "--streams", "16", "--seconds", "0.3", "--max-error-ms", "10000", "--workers", "0",
        "--keep-alive", "--out", str(tmp_path),
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0
    assert "measures up to 16 concurrent streams within 10000 ms" in out
    (written,) = tmp_path.glob("calibration-*.json")
    assert str(written) in out.replace("\n", "")
    assert json.loads(written.read_text())["fake_closes_connections"] is False


def test_cli_calibrate_refuses_unbounded_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["calibrate", "--streams", "1,5000"]) != 0
    assert "1024" in capsys.readouterr().err


def test_a_fake_on_another_host_is_checked_before_it_is_used(tmp_path: Path) -> None:
    script = calibration_script(CalibrateSettings())
    with FakeServerProcess(script) as fake:  # as another host would serve it
        assert RemoteFake(fake.url, script).check().stats()["requests"] == 0
        other = dataclasses.replace(script, close_after_stream=not script.close_after_stream)
        with pytest.raises(CalibrationError, match="close_after_stream differ") as differs:
            RemoteFake(fake.url, other).check()
        assert "--keep-alive" in differs.value.hint
    with pytest.raises(CalibrationError, match="did not answer /script") as gone:
        RemoteFake(fake.url, script, timeout_s=2).check()
    assert "--serve-fake" in gone.value.hint


@pytest.mark.slow
def test_calibrate_drives_a_fake_another_host_serves(tmp_path: Path) -> None:
    settings = CalibrateSettings(streams=(4,), seconds_per_count=0.3, max_error_p99_s=10.0)
    with FakeServerProcess(calibration_script(settings)) as fake:
        remote = settings.model_copy(update={"fake_url": fake.url})
        result = run_calibration(remote, LoadSettings(workers=0))
        served = fake.stats()["requests"]
    assert result.fake_url == fake.url
    (found,) = result.counts
    assert found.ok == found.requests >= MIN_REQUESTS and served >= found.requests
    assert found.ttft_error_p99_s is not None


@pytest.mark.slow
def test_cli_serve_fake_serves_the_calibration_script_until_stopped() -> None:
    command = [sys.executable, "-m", "quantload.cli.main", "calibrate", "--serve-fake", "127.0.0.1:0"]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=clean_env())
    try:
        assert process.stderr is not None
        line = process.stderr.readline()
        match = re.search(r"serving on (http://127\.0\.0\.1:\d+)", line)
        assert match, line
        served = httpx.get(f"{match.group(1)}/script", timeout=10).json()
        assert served["ttft_ms"] == list(SCRIPT.ttft_ms) and served["close_after_stream"] is True
        assert f"--fake-url {match.group(1)}" in line
    finally:
        process.terminate()
        code = process.wait(90)  # its shutdown may wait long for a core on a busy machine
    assert code == 0  # a server stopped as asked, as `quantload exporter` is


def test_cli_refuses_a_bad_fake_url_or_address(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["calibrate", "--fake-url", "http://10.0.0.7:99999"]) == 2
    assert "calibrate.fake_url" in capsys.readouterr().err
    assert cli_main(["calibrate", "--serve-fake", "10.0.0.7"]) == 2
    assert "is not HOST:PORT" in capsys.readouterr().err
