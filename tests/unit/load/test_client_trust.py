"""The client says when it cannot be trusted: each stage's verdict (ok, degraded, saturated) from
its event loop's lateness and this machine's calibration; the calibration read as this machine's
limits; `--workers auto` spreading over them; the report's client-health section and `quantload
load`'s table; and a real sweep against the fake held to a calibration it exceeds.

Its tests that start processes: tests/integration/load/test_client_trust_processes.py.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pandas as pd

from quantload.analysis.stage_tables import client_verdict, lagging_stages
from quantload.config import Settings
from quantload.load.calibration_file import (
    Calibration,
    CountResult,
    machine_limits,
    streams_per_process,
    write_calibration,
)
from quantload.load.client_health import ClientHealth, TrustBounds
from quantload.load.processes import usable_cores

BOUNDS = TrustBounds(
    error_s=0.005, lag_s=0.005, streams_per_process=256, saturation_cpu_frac=0.9, saturation_lag_s=0.05
)


def health(cpu_frac: float, lag_s: float) -> ClientHealth:
    measured = ClientHealth()
    measured.add("h:1", cpu_frac * 10.0, 10.0, [lag_s] * 100)
    return measured


def test_a_stage_is_ok_within_the_stated_error_and_degraded_between_it_and_saturation() -> None:
    assert health(0.5, 0.002).trust(BOUNDS, 256).level == "ok"
    late = health(0.6, 0.012).trust(BOUNDS, 200)
    assert late.level == "degraded" and late.why is not None
    assert "woke up 12.0 ms late (p99), more than the 5.0 ms its figures are stated within" in late.why
    crowded = health(0.5, 0.001).trust(BOUNDS, 512)
    assert crowded.level == "degraded"
    assert crowded.why == "512 streams per load process, more than the 256 this machine's calibration measured right"
    assert health(0.95, 0.002).trust(BOUNDS, 100).level == "saturated"
    assert health(0.3, 0.06).trust(BOUNDS, 100).level == "saturated"
    assert ClientHealth().trust(BOUNDS, 100) is None  # nothing measured: no verdict
    assert ClientHealth().trust(BOUNDS, 300).level == "degraded"  # but beyond the calibration still
    uncalibrated = TrustBounds(0.005, 0.005, None, 0.9, 0.05)
    assert health(0.5, 0.001).trust(uncalibrated, 5000).level == "ok"  # only the lag speaks
    seen_right = TrustBounds(0.005, 0.008, 256, 0.9, 0.05)  # calibrated right with 8 ms of lag
    assert health(0.5, 0.007).trust(seen_right, 100).level == "ok"
    beyond = health(0.5, 0.012).trust(seen_right, 100)
    assert beyond.level == "degraded" and "(and the 8.0 ms calibrated)" in (beyond.why or "")


def counts(*found: tuple[int, int, bool], lag_s: float | None = None) -> tuple[CountResult, ...]:
    return tuple(
        CountResult(
            streams=streams, workers=workers, requests=10, ok=10, ttft_error_p50_s=0.001,
            ttft_error_p99_s=0.002, ttft_error_vs_script_p99_s=0.003, itl_error_p50_s=0.0,
            itl_error_p99_s=0.001, server_token_late_p99_s=0.001, delivered_concurrency=float(streams),
            client_cpu_frac=0.5, client_cpu_per_100_streams=0.5, within_error=within,
            loop_lag_p99_s=lag_s if within else 0.5,
        )
        for streams, workers, within in found
    )


def calibration(found: tuple[CountResult, ...], host: str | None = None, trusted: int | None = None) -> Calibration:
    return Calibration(
        created_unix_s=1.8e9, host=host or socket.gethostname(), cores=usable_cores(), python="3",
        load_average_before=None, load_average_after=None, fake_ttft_ms=(20.0, 200.0),
        fake_itl_ms=(5.0, 20.0), fake_tokens=16, fake_closes_connections=True, max_error_p99_s=0.004,
        counts=found, trusted_streams=trusted,
    )  # fmt: skip


def test_the_streams_one_process_measured_right_come_from_the_calibration() -> None:
    assert streams_per_process(calibration(counts((64, 0, True), (256, 0, True), (512, 0, False)), trusted=256)) == 256
    assert streams_per_process(calibration(counts((256, 0, True), (512, 2, True)), trusted=512)) == 256
    assert streams_per_process(calibration(counts((8, 0, False)), trusted=None)) == 0.0


def test_the_machines_limits_are_its_own_latest_calibration_or_the_configured_error(tmp_path: Path) -> None:
    settings = Settings.model_validate({"run": {"out": "results"}, "calibrate": {"max_error_p99_s": 0.003}})
    assert machine_limits(settings, tmp_path) == machine_limits(settings, tmp_path)  # absent: no file
    absent = machine_limits(settings, tmp_path)
    assert (absent.error_s, absent.streams_per_process) == (0.003, None)
    folder = tmp_path / "results" / "calibration"
    write_calibration(calibration(counts((64, 0, True), (256, 0, False)), trusted=64), folder)
    mine = machine_limits(settings, tmp_path)
    assert (mine.error_s, mine.lag_s, mine.streams_per_process) == (0.004, 0.004, 64)  # its own bound
    assert mine.source.startswith("calibration of ")
    write_calibration(calibration(counts((64, 0, True), (256, 0, False), lag_s=0.007), trusted=64), folder)
    assert machine_limits(settings, tmp_path).lag_s == 0.007  # measured right with 7 ms of lag
    write_calibration(calibration(counts((64, 0, True)), host="elsewhere", trusted=64), folder)
    other = machine_limits(settings, tmp_path)
    assert other.streams_per_process is None and "another machine" in other.source
    (folder / "latest.json").write_text("{not json", encoding="utf-8")
    assert machine_limits(settings, tmp_path).streams_per_process is None


def _stages(**rows: list[object]) -> pd.DataFrame:
    base = {"quant": ["Q4_K_M", "Q4_K_M", "Q4_K_M"], "experiment": ["sweep"] * 3, "users": [64, 256, 512],
            "repeat": [0, 0, 0], "lag_p99_s": [0.001, 0.001, 0.001], "client_saturated": [False, False, False],
            "loop_lag_p99_s": [0.001, 0.009, 0.03], "client_cpu_frac": [0.2, 0.5, 0.8]}  # fmt: skip
    return pd.DataFrame({**base, **rows})


def test_the_reports_client_health_names_the_degraded_stages_and_why() -> None:
    stages = _stages(
        client_trust=["ok", "degraded", "degraded"],
        client_trust_why=[None, "its event loop woke up 9.0 ms late (p99)", "512 streams per load process"],
    )
    flagged = lagging_stages(stages, 0.05)
    assert list(flagged["users"]) == [256, 512]
    assert "figures may be worse than stated: its event loop woke up 9.0 ms late" in flagged["why"].iloc[0]
    sentence = client_verdict(stages, flagged, 0.05)
    assert sentence.startswith("In 2 of 3 stages the client's own timing error may be larger")
    assert "quantload calibrate" in sentence
    clean = _stages(client_trust=["ok", "ok", "ok"], client_trust_why=[None, None, None])
    assert lagging_stages(clean, 0.05).empty
    assert "no stage reported saturation or figures worse" in client_verdict(clean, lagging_stages(clean, 0.05), 0.05)
