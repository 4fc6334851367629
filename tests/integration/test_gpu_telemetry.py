"""The GPU series through a real Prometheus: the exporter over a fake NVML (tests/fake_nvml.py; no
GPU on this machine), Prometheus (Debian binary) scraping it every second, then the report's
energy per output token and per request, and the dashboard's GPU panels, read from that Prometheus.
Three GPUs: one a server uses (found through its log's PCI address), one idle beside it, one split
into MIG slices; a second server on a slice, a third on the CPU; an idle baseline before the load.

What this proves: the series' names, types and labels survive a real scrape, the PromQL of the
report and of the GPU panels is valid and returns the figures the fake's power implies (the served
GPU's alone, its idle draw taken off for the load's own energy), MIG and the CPU server are said
and not counted, and a window without GPU series becomes a gap line. What it cannot prove: a real GPU's NVML answers
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
from quantload.exporter.targets import ExporterTarget, targets_from_specs
from quantload.llamacpp.server import free_port
from quantload.observe.prometheus import PrometheusProcess
from quantload.observe.promql import PrometheusClient
from quantload.rundir.gpu_file import GpuFile, IdleWindow
from support import require_binary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

OVERVIEW = Path(__file__).resolve().parents[2] / "grafana" / "dashboards" / "quantload-overview.json"
SCRAPE_S = 1.0
WINDOW_S = 6.0
IDLE_W, BUSY_W, OTHER_W = 50.0, 200.0, 100.0  # the served GPU idle and loaded; an idle GPU beside it
CUDA_LOAD_LOG = (
    "llama_model_load_from_file_impl: using device CUDA0 (NVIDIA Fake 80GB) (0000:3b:00.0) - 80000 MiB free\n"
    "load_tensors: offloading output layer to GPU\n"
    "load_tensors: offloaded 25/25 layers to GPU\n"
)


def _records(quant: str, start: float, requests: int, tokens_each: int) -> list[dict[str, object]]:
    step = WINDOW_S / requests
    return [
        {"quant": quant, "sent_unix_s": start + i * step, "e2e_s": step, "completion_tokens": tokens_each}
        for i in range(requests)
    ]


def _targets(logs: Path) -> list[ExporterTarget]:
    """Q8_0 on GPU-0 (its log's PCI address), Q4_K_M on a MIG slice (named), F16 on the CPU (its
    log: a CUDA build asked for 0 layers). No server answers: the placement needs none."""
    (logs / "q8.log").write_text(CUDA_LOAD_LOG)
    (logs / "f16.log").write_text("load_tensors: offloaded 0/25 layers to GPU\n")
    return targets_from_specs([
        f"llama-q8-0=http://127.0.0.1:{free_port()},quant=Q8_0,model=tiny,log={logs / 'q8.log'}",
        f"llama-q4-k-m=http://127.0.0.1:{free_port()},quant=Q4_K_M,model=tiny,gpus=MIG-slice-1",
        f"llama-f16=http://127.0.0.1:{free_port()},quant=F16,model=tiny,log={logs / 'f16.log'}",
    ])  # fmt: skip


def test_energy_of_each_servers_own_gpus_and_the_gpu_panels_from_a_real_prometheus(tmp_path: Path) -> None:
    require_binary("prometheus", "apt-get install prometheus")
    served = FakeGpu(uuid="GPU-0", pci_bus_id="00000000:3B:00.0", power_mw=round(IDLE_W * 1000))
    idle = FakeGpu(uuid="GPU-1", pci_bus_id="00000000:65:00.0", power_mw=round(OTHER_W * 1000))
    sliced = FakeGpu(uuid="GPU-2", pci_bus_id="00000000:B1:00.0", mig_uuids=("MIG-slice-0", "MIG-slice-1"))
    nvml = FakeNvml([served, idle, sliced])
    exporter = start_exporter(_targets(tmp_path), port=0, timeout_s=0.5, nvml=nvml.loader)
    try:
        assert exporter.gpu is not None and exporter.gpu.gpu_count == 3
        with PrometheusProcess(tmp_path, exporter.url, [], SCRAPE_S) as prometheus:
            assert prometheus.wait_scraping()
            time.sleep(2 * SCRAPE_S)
            idle_start = time.time()
            time.sleep(WINDOW_S)
            idle_end = time.time()
            served.energy_now()  # the counter so far at the idle draw, then the load's draw
            served.power_mw = round(BUSY_W * 1000)
            first = time.time()
            time.sleep(WINDOW_S + 3 * SCRAPE_S)
            gpu_file = GpuFile(idle=(IdleWindow(quants=("Q8_0",), start_unix_s=idle_start, end_unix_s=idle_end),))
            records = pd.DataFrame(
                _records("Q8_0", first, 12, 50) + _records("Q4_K_M", first, 6, 100) + _records("F16", first, 6, 100)
            )
            with PrometheusClient(prometheus.url) as client:
                table, gaps = gpu_energy_table(client, records, ("Q8_0", "Q4_K_M", "F16"), gpu_file)
                (row,) = table.to_dict("records")
                assert row["quant"] == "Q8_0" and row["gpus"] == 1 and row["source"] == "energy counter"
                assert row["requests"] == 12 and row["output_tokens"] == 600
                # GPU-0 alone (not GPU-1's 100 W beside it), within a scrape's worth of extrapolation
                assert BUSY_W * 0.75 <= row["mean_power_w"] <= BUSY_W * 1.25, row
                assert row["idle_power_w"] == pytest.approx(IDLE_W, rel=0.05), row
                load_w = row["load_energy_j"] / row["window_s"]
                assert (BUSY_W - IDLE_W) * 0.7 <= load_w <= (BUSY_W - IDLE_W) * 1.3, row
                assert row["load_j_per_output_token"] == pytest.approx(row["load_energy_j"] / 600)
                why = {gap.what.rsplit(" of ", 1)[1]: gap.why for gap in gaps}
                assert "MIG slice" in why["Q4_K_M"] and "ran on the CPU" in why["F16"], why

                # Without an idle window the total stands alone; the load's own columns are empty.
                table, _ = gpu_energy_table(client, records, ("Q8_0",))
                assert pd.isna(table.iloc[0]["load_energy_j"]) and table.iloc[0]["energy_j"] > 0

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
