"""A real sweep (Locust processes) against the fake server, held to a calibration it exceeds, says so
on the console, in its stage lines and in the report.

Moved from tests/unit/load/test_client_trust.py, whose other tests start no process.
"""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from load_api import context, sweep_of
from quantload.cli.load_console import stage_table
from quantload.config import LoadSettings, Settings
from quantload.load.calibration_file import (
    Calibration,
    CountResult,
    write_calibration,
)
from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.load.processes import usable_cores
from quantload.load.prompts import Prompt
from quantload.load.supervisor import run_plan
from quantload.served import ServedTarget

pytestmark = pytest.mark.integration


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


@pytest.mark.slow
def test_a_sweep_held_to_a_calibration_it_exceeds_says_so_in_every_way(tmp_path: Path) -> None:
    settings = Settings.model_validate({"run": {"out": "results"}})
    write_calibration(calibration(counts((1, 0, True), (2, 0, False)), trusted=1), tmp_path / "results" / "calibration")
    script = FakeScript(ttft_ms=(2, 5), itl_ms=(1, 2), tokens=4, close_after_stream=True)
    # saturation set out of reach: on a busy machine the event loop can wake 50 ms late, and what
    # is held here is the calibration's bound between the stated error and saturation
    load = LoadSettings(users=(1, 3), repeats=1, warmup_requests=0, request_timeout_s=10, metrics_port=0,
                        max_tokens=4, first_round_jitter_s=0.01, saturation_cpu_frac=1000.0,
                        saturation_lag_s=3600.0)  # fmt: skip
    prompts = [Prompt(f"p{i}", f"prompt {i}", 2) for i in range(60)]  # long enough for health windows
    with FakeServer(script) as fake:
        target = ServedTarget(name="fake", quant="Q4_K_M", model="m", url=fake.url)
        run = context(tmp_path, load, run=settings.run.model_dump(mode="json"))
        summaries = run_plan(sweep_of(load, target, prompts), run).summaries
    one, three = summaries
    assert one.client_trust in ("ok", "degraded")  # one stream is what was proved: only lag may flag it
    assert "streams per load process" not in (one.client_trust_why or "")
    assert three.client_trust == "degraded"
    assert "3 streams per load process, more than the 1 this machine's calibration measured right" in (
        three.client_trust_why or ""
    )
    rendered = stage_table(summaries)
    assert "degraded" in [cell for column in rendered.columns for cell in column._cells]
