"""`quantload calibrate` run for real: against the fake server in a process of its own (as another
host would serve it), from the command line, and `--serve-fake` serving until stopped; each run
starts Locust processes.

Moved from tests/unit/load/test_calibrate.py, whose other tests start no process.
"""

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
    run_calibration,
)
from quantload.load.calibration_file import (
    LATEST_JSON,
    SCHEMA,
    Calibration,
    write_calibration,
)
from quantload.load.fakeserver import FakeServerProcess
from support import clean_env

pytestmark = pytest.mark.integration


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
