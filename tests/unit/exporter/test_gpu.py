"""GPU telemetry in the exporter, against a fake NVML (tests/fake_nvml.py) passed in as its loader."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator

import httpx
import pytest

from fake_nvml import GPU_IS_LOST, LIBRARY_NOT_FOUND, FakeGpu, FakeNvml, failing_import
from quantload.exporter import start_exporter
from quantload.exporter.gpu import GpuCollector, open_gpu_telemetry

LOGGER = "quantload.exporter.gpu"


def _samples(collector: GpuCollector) -> dict[tuple[str, str], float]:
    """{(sample name, gpu index): value} of one scrape."""
    return {
        (sample.name, sample.labels["gpu"]): sample.value
        for family in collector.collect()
        for sample in family.samples
    }


@pytest.fixture
def collectors() -> Iterator[list[GpuCollector]]:
    made: list[GpuCollector] = []
    yield made
    for collector in made:
        collector.close()


def _open(nvml: FakeNvml, made: list[GpuCollector], timeout_s: float = 1.0) -> GpuCollector:
    collector = open_gpu_telemetry(nvml.loader, timeout_s)
    assert collector is not None
    made.append(collector)
    return collector


def test_every_gpu_reports_utilisation_memory_power_and_energy_in_si_units(
    collectors: list[GpuCollector],
) -> None:
    nvml = FakeNvml(
        [
            FakeGpu(uuid="GPU-a", utilization_percent=75, power_mw=312_500, energy_mj=9_000_000),
            FakeGpu(uuid="GPU-b", name="NVIDIA Other", utilization_percent=0, power_mw=60_000),
        ]
    )
    collector = _open(nvml, collectors)
    values = _samples(collector)
    assert values[("quantload_gpu_utilization_ratio", "0")] == 0.75
    assert values[("quantload_gpu_utilization_ratio", "1")] == 0.0
    assert values[("quantload_gpu_power_watts", "0")] == 312.5
    assert values[("quantload_gpu_memory_used_bytes", "0")] == 2 * 1024**3
    assert values[("quantload_gpu_memory_total_bytes", "1")] == 80 * 1024**3
    assert values[("quantload_gpu_energy_joules_total", "0")] >= 9000.0
    families = {family.name: family for family in collector.collect()}
    assert families["quantload_gpu_energy_joules"].type == "counter"
    assert families["quantload_gpu_power_watts"].type == "gauge"
    labels = families["quantload_gpu_power_watts"].samples[1].labels
    assert labels == {"gpu": "1", "uuid": "GPU-b", "gpu_name": "NVIDIA Other"}


def test_the_energy_counter_grows_with_power_and_time(collectors: list[GpuCollector]) -> None:
    nvml = FakeNvml([FakeGpu(power_mw=200_000, energy_mj=0)])
    collector = _open(nvml, collectors)
    first = _samples(collector)[("quantload_gpu_energy_joules_total", "0")]
    time.sleep(0.2)
    second = _samples(collector)[("quantload_gpu_energy_joules_total", "0")]
    assert second > first  # 200 W for 0.2 s is about 40 J; only the direction is asserted here


@pytest.mark.parametrize(
    ("nvml", "said"),
    [
        (FakeNvml(init_error=LIBRARY_NOT_FOUND), "NVML is not available here"),
        (FakeNvml(gpus=[]), "sees no GPU"),
    ],
    ids=["no-nvml-library", "no-gpu"],
)
def test_without_nvml_or_a_gpu_the_series_are_absent_and_said_once(
    nvml: FakeNvml, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert open_gpu_telemetry(nvml.loader, 1.0) is None
    lines = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(lines) == 1 and said in lines[0] and "no quantload_gpu_* series" in lines[0]


def test_missing_bindings_are_the_same_as_no_nvml(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger=LOGGER):
        assert open_gpu_telemetry(failing_import(), 1.0) is None
    assert "cannot be imported" in caplog.text


def test_nvml_that_never_initialises_costs_the_start_up_bound_only() -> None:
    nvml = FakeNvml(hang_init=True)
    started = time.monotonic()
    try:
        assert open_gpu_telemetry(nvml.loader, 0.5, init_timeout_s=0.3) is None
        assert time.monotonic() - started < 10  # bounded; 30 s is what the hang would take
    finally:
        nvml.release.set()


def test_a_quantity_a_gpu_cannot_report_is_left_out_for_that_gpu_and_said_once(
    collectors: list[GpuCollector], caplog: pytest.LogCaptureFixture
) -> None:
    nvml = FakeNvml([FakeGpu(unsupported={"energy"}), FakeGpu(uuid="GPU-b")])
    collector = _open(nvml, collectors)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(3):
            values = _samples(collector)
    assert ("quantload_gpu_energy_joules_total", "0") not in values
    assert ("quantload_gpu_energy_joules_total", "1") in values
    assert ("quantload_gpu_power_watts", "0") in values
    said = [r.getMessage() for r in caplog.records if "does not report" in r.getMessage()]
    assert len(said) == 1 and "quantload_gpu_energy_joules_total" in said[0]


def test_a_failing_read_costs_that_series_only_with_a_rate_limited_line(
    collectors: list[GpuCollector], caplog: pytest.LogCaptureFixture
) -> None:
    lost = FakeGpu(failing={"power": GPU_IS_LOST})
    collector = _open(FakeNvml([lost, FakeGpu(uuid="GPU-b")]), collectors)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        for _ in range(3):
            values = _samples(collector)
    assert ("quantload_gpu_power_watts", "0") not in values
    assert ("quantload_gpu_utilization_ratio", "0") in values
    assert ("quantload_gpu_power_watts", "1") in values
    warned = [r for r in caplog.records if "quantload_gpu_power_watts" in r.getMessage()]
    assert len(warned) == 1  # once per minute, not once per scrape


def test_a_hung_read_costs_scrapes_their_gpu_series_within_the_bound_and_is_not_repeated(
    collectors: list[GpuCollector],
) -> None:
    nvml = FakeNvml()
    collector = _open(nvml, collectors, timeout_s=0.2)
    assert _samples(collector)
    nvml.hang_power = True
    try:
        started = time.monotonic()
        assert collector.collect() == []
        assert collector.collect() == []  # the hung read still runs: no second one
        assert time.monotonic() - started < 10
        assert nvml.power_reads == 2  # the good scrape's and the hung one
    finally:
        nvml.hang_power = False
        nvml.release.set()
    deadline = time.monotonic() + 10
    while not _samples(collector) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ("quantload_gpu_power_watts", "0") in _samples(collector)


def test_the_exporter_serves_gpu_series_beside_the_servers_and_releases_nvml() -> None:
    nvml = FakeNvml([FakeGpu(power_mw=250_000)])
    handle = start_exporter([], port=0, timeout_s=0.5, nvml=nvml.loader)
    try:
        body = httpx.get(f"{handle.url}/metrics", timeout=5).text
    finally:
        handle.stop()
    assert 'quantload_gpu_power_watts{gpu="0",gpu_name="NVIDIA Fake 80GB",uuid=' in body
    assert "# TYPE quantload_gpu_energy_joules_total counter" in body
    assert "quantload_exporter_scrape_duration_seconds" in body
    assert nvml.shutdowns == 1


def test_the_exporter_without_nvml_serves_no_gpu_series() -> None:
    handle = start_exporter([], port=0, nvml=FakeNvml(init_error=LIBRARY_NOT_FOUND).loader)
    try:
        body = httpx.get(f"{handle.url}/metrics", timeout=5).text
    finally:
        handle.stop()
    assert handle.gpu is None
    assert "quantload_exporter_scrape_duration_seconds" in body and "quantload_gpu_" not in body


def test_a_hung_nvml_does_not_hold_the_exporter_scrape() -> None:
    nvml = FakeNvml()
    handle = start_exporter([], port=0, timeout_s=0.5, nvml=nvml.loader)
    nvml.hang_power = True
    try:
        started = time.monotonic()
        body = httpx.get(f"{handle.url}/metrics", timeout=20).text
        assert time.monotonic() - started < 10  # the hang would take 30 s; the bound is 0.25 s
        assert "quantload_exporter_scrape_duration_seconds" in body and "quantload_gpu_" not in body
    finally:
        nvml.release.set()
        handle.stop()
