"""`quantload calibrate`'s logic: the errors it computes, its verdict, and the counts and URLs it
refuses.

Runs against the fake (processes): tests/integration/load/test_calibrate_processes.py.
"""

from __future__ import annotations

import pytest

from quantload.cli.main import main as cli_main
from quantload.load.calibrate import (
    MIN_REQUESTS,
    count_result,
    requests_for,
)
from quantload.load.calibration_file import (
    CountResult,
    trusted_streams,
)
from quantload.load.records import RequestRecord

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


def test_cli_calibrate_refuses_unbounded_counts(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["calibrate", "--streams", "1,5000"]) != 0
    assert "1024" in capsys.readouterr().err


def test_cli_refuses_a_bad_fake_url_or_address(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["calibrate", "--fake-url", "http://10.0.0.7:99999"]) == 2
    assert "calibrate.fake_url" in capsys.readouterr().err
    assert cli_main(["calibrate", "--serve-fake", "10.0.0.7"]) == 2
    assert "is not HOST:PORT" in capsys.readouterr().err
