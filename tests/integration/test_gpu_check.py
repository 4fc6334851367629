"""The offline GPU check (benchmarks/gpu_check.py) run here: it refuses in one line where NVML lists
no GPU, and passes against this machine's CPU build of llama.cpp with a fake NVML whose GPU draws
more while the check loads the server (what a real one does), so that only the steps that need a
GPU backend (offload N/N, the server's GPUs, the GPU roofline) are left for a machine with one.
The tiny model only: the ~1B one is for the GPU."""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from types import ModuleType

import pytest

from fake_nvml import FakeGpu, FakeNvml
from quantload.llamacpp.toolchain import Toolchain

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]
CHECK = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
IDLE_MW, LOAD_MW = 60_000, 250_000


def _check_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gpu_check", CHECK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gpu_check"] = module
    spec.loader.exec_module(module)
    return module


def test_the_check_refuses_in_one_line_where_no_gpu_is_found(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    check = _check_module()
    assert check.main(["--work", str(tmp_path)], nvml=FakeNvml(init_error=12).loader) == 2
    (line,) = capsys.readouterr().out.strip().splitlines()
    assert line.startswith("gpu check: no NVIDIA GPU found (NVML is not available here")
    assert not any(tmp_path.iterdir())  # nothing built, written or started


def test_the_check_passes_against_a_cpu_build_with_a_fake_nvml(
    tmp_path: Path, toolchain: Toolchain, tiny_models: dict[str, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    check = _check_module()
    gpu = FakeGpu(name="NVIDIA H200", power_mw=IDLE_MW, memory_total_bytes=141 * 1024**3)
    nvml = FakeNvml([gpu])

    def on_phase(phase: str) -> None:  # the card draws more while it serves
        gpu.energy_now()
        gpu.power_mw = LOAD_MW if phase == "load" else IDLE_MW

    environ = {**os.environ, "QUANTLOAD_LLAMA_BIN": str(toolchain.tools["llama-server"].parent)}
    argv = ["--work", str(tmp_path / "work"), "--out", str(tmp_path / "out"), "--big-params", "0",
            "--requests", "6", "--concurrency", "2", "--max-tokens", "16", "--idle-s", "2",
            "--bench-reps", "1", "--bench-prompt", "64", "--bench-gen", "16", "--cpu-build",
            "--tiny", str(tiny_models["F16"])]  # fmt: skip
    code = check.main(argv, nvml=nvml.loader, environ=environ, on_phase=on_phase)
    printed = capsys.readouterr().out
    assert code == 0, printed
    (figure_file,) = (tmp_path / "out").glob("gpu-check-*.json")
    written = json.loads(figure_file.read_text())
    results = {row["check"]: row["passed"] for row in written["checks"]}
    assert results[f"{tiny_models['F16'].stem} offload N/N"] is None  # a CPU build: no GPU backend, said
    assert results["decode at most 100 % of the GPU roofline"] is None
    telemetry = [name for name in results if name.startswith(gpu.uuid)]
    assert len(telemetry) == 5 and all(results[name] for name in telemetry), results
    figures = written["figures"]["telemetry"][gpu.uuid]
    assert figures["idle_power_w"] == pytest.approx(IDLE_MW / 1000)
    assert figures["load_power_w"] == pytest.approx(LOAD_MW / 1000)
    assert figures["energy_counter_j"] == pytest.approx(figures["power_integral_j"], rel=0.2)
    assert written["figures"]["load"]["output_tokens"] == 6 * 16
    assert (tmp_path / "out" / figure_file.with_suffix(".md").name).is_file()
