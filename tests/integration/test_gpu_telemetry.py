"""The GPU series through a real Prometheus: the exporter over a fake NVML (tests/fake_nvml.py; no
GPU on this machine), Prometheus (Debian binary) scraping it every second, then the report's
energy per output token and per request, and the dashboard's GPU panels, read from that Prometheus.

What this proves: the series' names, types and labels survive a real scrape, the PromQL of the
report and of the GPU panels is valid and returns the figures the fake's power implies, and a
window without GPU series becomes a gap line. What it cannot prove: a real GPU's NVML answers
(benchmarks/gpu_telemetry_check.sh does that on a machine with one).
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import pytest

from dashboard_check import check_dashboard, load_dashboard
from fake_nvml import FakeGpu, FakeNvml
from quantload.analysis.gpu_energy import NO_GPU_WHY, gpu_energy_table
from quantload.exporter import start_exporter
from quantload.observe.prometheus import PrometheusProcess
from quantload.observe.promql import PrometheusClient
from support import require_binary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

OVERVIEW = Path(__file__).resolve().parents[2] / "grafana" / "dashboards" / "quantload-overview.json"
SCRAPE_S = 1.0
WINDOW_S = 6.0
POWER_W = (200.0, 100.0)  # the two fake GPUs draw 300 W together


def _records(quant: str, start: float, requests: int, tokens_each: int) -> list[dict[str, object]]:
    step = WINDOW_S / requests
    return [
        {"quant": quant, "sent_unix_s": start + i * step, "e2e_s": step, "completion_tokens": tokens_each}
        for i in range(requests)
    ]


def test_energy_per_token_and_the_gpu_panels_from_a_real_prometheus(tmp_path: Path) -> None:
    require_binary("prometheus", "apt-get install prometheus")
    nvml = FakeNvml([FakeGpu(uuid=f"GPU-{i}", power_mw=round(w * 1000)) for i, w in enumerate(POWER_W)])
    exporter = start_exporter([], port=0, timeout_s=0.5, nvml=nvml.loader)
    try:
        assert exporter.gpu is not None and exporter.gpu.gpu_count == 2
        with PrometheusProcess(tmp_path, exporter.url, [], SCRAPE_S) as prometheus:
            assert prometheus.wait_scraping()
            time.sleep(2 * SCRAPE_S)
            first = time.time()
            time.sleep(2 * WINDOW_S + 3 * SCRAPE_S)
            records = pd.DataFrame(
                _records("Q8_0", first, 12, 50) + _records("Q4_K_M", first + WINDOW_S, 6, 100)
            )
            with PrometheusClient(prometheus.url) as client:
                table, gaps = gpu_energy_table(client, records, ("Q8_0", "Q4_K_M"))
                assert not gaps, gaps
                rows = {row["quant"]: row for row in table.to_dict("records")}
                for quant, requests, tokens in (("Q8_0", 12, 600), ("Q4_K_M", 6, 600)):
                    row = rows[quant]
                    assert row["gpus"] == 2 and row["source"] == "energy counter"
                    assert row["requests"] == requests and row["output_tokens"] == tokens
                    # 300 W over a 6 s window, within a scrape's worth of extrapolation
                    assert sum(POWER_W) * 0.75 <= row["mean_power_w"] <= sum(POWER_W) * 1.25, row
                    assert row["j_per_output_token"] == pytest.approx(row["energy_j"] / tokens)
                    assert row["j_per_request"] == pytest.approx(row["energy_j"] / requests)

                # Two quantizations loaded at once: their energy cannot be split, and the report says so.
                both = pd.DataFrame(_records("Q8_0", first, 6, 10) + _records("F16", first + 1, 6, 10))
                table, gaps = gpu_energy_table(client, both, ("Q8_0", "F16"))
                assert table.empty and len(gaps) == 2
                assert all("overlapped" in gap.why for gap in gaps)

                # A window before the exporter ran holds no GPU series: one gap line, no error.
                past = pd.DataFrame(_records("Q8_0", first - 3600, 4, 10))
                table, gaps = gpu_energy_table(client, past, ("Q8_0",))
                assert table.empty and [gap.why for gap in gaps] == [NO_GPU_WHY]

                checks = check_dashboard(client, load_dashboard(OVERVIEW), first, time.time(), SCRAPE_S)
                gpu = [check for check in checks if check.query.needs_gpu]
                power = [check for check in gpu if "power" in check.query.where.lower()]
                assert power and gpu
                # Every GPU query runs; those of GPU series alone have data (the J/token line also
                # needs load generators, which this test has none of, so it runs and finds none).
                assert all(check.error is None for check in gpu), [c.describe() for c in gpu]
                gpu_only = [c for c in gpu if "quantload_output_tokens_total" not in c.expr]
                assert all(check.ok for check in gpu_only), [c.describe() for c in gpu_only]
    finally:
        exporter.stop()
    assert nvml.shutdowns == 1
