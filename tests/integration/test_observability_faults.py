"""Real Prometheus scraping the exporter while some targets misbehave (fake llama-servers).

A target that is down, slow beyond the timeout, or answering garbage reads `quantload_target_up 0`
within the timeout; the good target, the exporter's own scrape by Prometheus and its duration
are unaffected.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fake_llama_server import FakeLlamaServer
from quantload.exporter import ExporterTarget, start_exporter
from quantload.observe.prometheus import PrometheusProcess
from quantload.observe.promql import PrometheusClient
from support import require_binary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]
EXPORTER_TIMEOUT_S = 0.5


@pytest.fixture
def faulty_fakes() -> Iterator[dict[str, FakeLlamaServer]]:
    fakes = {name: FakeLlamaServer().start() for name in ("good", "slow", "garbage", "down")}
    fakes["slow"].delay_s = 3.0
    fakes["garbage"].mode = "garbage"
    fakes["down"].stop()
    yield fakes
    for name, fake in fakes.items():
        if name != "down":
            fake.stop()


def test_faulty_targets_do_not_disturb_the_scrape(
    faulty_fakes: dict[str, FakeLlamaServer], tmp_path: Path
) -> None:
    require_binary("prometheus", "apt-get install prometheus")
    targets = [ExporterTarget(name=n, url=f.url, quant=n.upper(), model="m") for n, f in faulty_fakes.items()]
    exporter = start_exporter(targets, port=0, timeout_s=EXPORTER_TIMEOUT_S)
    try:
        with PrometheusProcess(tmp_path, exporter.url, [], 1.0) as prometheus:
            assert prometheus.wait_scraping()
            started = time.time()
            time.sleep(5)
            with PrometheusClient(prometheus.url) as client:
                end = time.time()

                def values(expr: str) -> list[float]:
                    series = client.query_range(expr, started, end, 1.0)
                    return [v for s in series for v in s.values()]

                scrape_up = values('up{job="exporter"}')
                assert scrape_up and set(scrape_up) == {1.0}
                durations = values('scrape_duration_seconds{job="exporter"}')
                assert durations and max(durations) < EXPORTER_TIMEOUT_S + 0.4, durations
                assert set(values('quantload_target_up{server="good"}')) == {1.0}
                for name in ("slow", "garbage", "down"):
                    assert set(values(f'quantload_target_up{{server="{name}"}}')) == {0.0}, name
                assert values('llamacpp_requests_processing{server="good"}')
                errors = 'quantload_target_scrape_errors_total{{server="{}", error="{}"}}'
                for name, error in (("slow", "timeout"), ("garbage", "parse"), ("down", "connect")):
                    counts = values(errors.format(name, error))
                    assert counts and max(counts) >= 3, (name, error, counts)
                assert max(values(errors.format("good", "timeout"))) == 0
        assert prometheus.pid is not None and not prometheus.alive()
        assert (tmp_path / "prometheus" / "data").is_dir()
    finally:
        exporter.stop()
