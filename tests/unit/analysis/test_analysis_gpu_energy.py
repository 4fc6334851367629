"""GPU energy per output token and per request: the load windows from the records, the report's
section and its gap lines. (Against a real Prometheus: tests/integration/test_gpu_telemetry.py.)"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pandas as pd

from quantload.analysis import build_report
from quantload.analysis.chapters.server import gpu_energy_section
from quantload.analysis.document import Bullets, Paragraph, Table
from quantload.analysis.gpu_energy import COLUMNS, NO_GPU_WHY, WHAT, gpu_energy_table, load_windows
from quantload.analysis.run_data import Gap
from quantload.llamacpp.offload import check_offload, parse_offload
from quantload.llamacpp.server import free_port
from quantload.observe.promql import PrometheusClient
from quantload.rundir.gpu_file import merge_offload


def _records() -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"quant": "Q8_0", "sent_unix_s": 100.0, "e2e_s": 2.0, "completion_tokens": 30},
            {"quant": "Q8_0", "sent_unix_s": 101.0, "e2e_s": 4.0, "completion_tokens": 20},
            {"quant": "Q8_0", "sent_unix_s": 102.0, "e2e_s": math.nan, "completion_tokens": None},  # failed
            {"quant": "Q4_K_M", "sent_unix_s": 110.0, "e2e_s": 1.0, "completion_tokens": 7},
        ]
    )


def test_a_load_window_spans_every_request_of_the_quantization_failures_included() -> None:
    q8, q4 = load_windows(_records(), ("Q8_0", "Q4_K_M", "F16"))
    assert (q8.quant, q8.start_unix_s, q8.end_unix_s, q8.requests, q8.output_tokens) == ("Q8_0", 100, 105, 3, 50)
    assert (q4.start_unix_s, q4.end_unix_s, q4.requests, q4.output_tokens) == (110, 111, 1, 7)
    assert not q8.overlaps(q4) and q8.overlaps(q8)
    assert load_windows(pd.DataFrame(), ("Q8_0",)) == []


def test_no_gpu_series_in_prometheus_is_one_gap_line_not_an_error() -> None:
    def empty(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={"status": "success", "data": {"resultType": "vector", "result": []}})

    client = PrometheusClient("http://p", transport=httpx.MockTransport(empty))
    table, gaps = gpu_energy_table(client, _records(), ("Q8_0", "Q4_K_M"))
    assert table.empty and list(table.columns) == COLUMNS
    assert [(g.section, g.what, g.why) for g in gaps] == [("gpu", WHAT, NO_GPU_WHY)]
    assert gaps[0].text().startswith("not measured: GPU energy per output token and per request: ")


@dataclass
class _Run:
    run_dir: Path = Path("/nonexistent/run")


@dataclass
class _Shown:
    """The fields of Analysis the GPU section reads."""

    gpu_energy: pd.DataFrame
    gaps: tuple[Gap, ...] = field(default_factory=tuple)
    run: _Run = field(default_factory=_Run)


def test_the_section_shows_the_table_and_says_what_is_missing() -> None:
    row = {
        "quant": "Q4_K_M", "window_s": 60.0, "gpus": 1, "energy_j": 18000.0, "mean_power_w": 300.0,
        "requests": 120, "output_tokens": 24000, "j_per_output_token": 0.75, "j_per_request": 150.0,
        "source": "energy counter",
    }  # fmt: skip
    gap = Gap("gpu", f"{WHAT} of F16", "its load overlapped that of Q8_0, so the GPUs' energy cannot be split")
    section = gpu_energy_section(_Shown(pd.DataFrame([row], columns=COLUMNS), (gap,)))  # type: ignore[arg-type]
    assert section is not None and section.key == "gpu"
    (table,) = [b for b in section.blocks if isinstance(b, Table)]
    assert table.rows[0][0] == "Q4_K_M" and "0.750" in table.rows[0] and "150.0" in table.rows[0]
    (notes,) = [b for b in section.blocks if isinstance(b, Bullets)]
    assert "not measured: GPU energy per output token and per request of F16" in notes.items[0]
    assert gpu_energy_section(_Shown(pd.DataFrame(columns=COLUMNS))) is None  # type: ignore[arg-type]


def test_a_report_without_prometheus_says_the_gpu_energy_is_not_measured(synthetic_run: Path) -> None:
    paths = build_report(synthetic_run, f"http://127.0.0.1:{free_port()}")
    markdown = paths.markdown.read_text()
    assert f"not measured: {WHAT}: " in markdown


def test_the_section_shows_each_servers_layers_on_the_gpu_and_says_which_fell_short(tmp_path: Path) -> None:
    logs = {
        "Q8_0": "using device CUDA0 (NVIDIA H100) (0000:3b:00.0) - 80000 MiB free\nload_tensors: offloaded 25/25 layers to GPU\n",
        "F16": "load_tensors: offloaded 12/25 layers to GPU\n",
    }
    for quant, log in logs.items():
        merge_offload(tmp_path / "gpu.json", quant, check_offload("all", parse_offload(log)))
    section = gpu_energy_section(_Shown(pd.DataFrame(columns=COLUMNS), run=_Run(tmp_path)))  # type: ignore[arg-type]
    assert section is not None
    (table,) = [b for b in section.blocks if isinstance(b, Table)]
    assert table.rows == (
        ("Q8_0", "all", "25/25", "CUDA0", "as asked"),
        ("F16", "all", "12/25", "-", "fewer than asked"),
    )
    assert any("F16 offloaded fewer layers than asked" in b.text for b in section.blocks if isinstance(b, Paragraph))


def test_a_cpu_build_left_to_auto_adds_no_gpu_section(tmp_path: Path) -> None:
    merge_offload(tmp_path / "gpu.json", "Q8_0", check_offload("auto", parse_offload("main: model loaded\n")))
    assert gpu_energy_section(_Shown(pd.DataFrame(columns=COLUMNS), run=_Run(tmp_path))) is None  # type: ignore[arg-type]
    merge_offload(tmp_path / "gpu.json", "F16", check_offload("all", parse_offload("main: model loaded\n")))
    section = gpu_energy_section(_Shown(pd.DataFrame(columns=COLUMNS), run=_Run(tmp_path)))  # type: ignore[arg-type]
    assert section is not None  # asked for the GPU and got the CPU: said
