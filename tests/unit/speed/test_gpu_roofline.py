"""GPU ceilings: bandwidth from NVML's clocks and bus width, arithmetic from the table of known parts
(NVML's FP32 rate otherwise, said), and each llama-bench test set against the device it ran on:
the CPU, the GPU, or both in turn for a partial offload; none for a GPU without limits."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from speed_helpers import limits, write_small_gguf
from test_roofline import captured_speed

from fake_nvml import FakeGpu, FakeNvml
from quantload.gpus import GpuInfo, read_gpu_inventory
from quantload.llamacpp.bench import SpeedResult
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.gguf_meta import read_gguf
from quantload.roofline.ceilings import UnknownGpuCeilings, device_ceilings, roofline
from quantload.roofline.gpu_limits import gpu_ceilings, gpu_limits, known_part

H100 = FakeGpu(name="NVIDIA H100 80GB HBM3", max_memory_clock_mhz=2619, memory_bus_width_bits=5120)


def _on(speed: SpeedResult, **changes: Any) -> SpeedResult:
    return speed.model_copy(update=changes)


def test_bandwidth_comes_from_nvml_clocks_and_arithmetic_from_the_datasheet_table() -> None:
    (h100,) = gpu_ceilings(lambda: read_gpu_inventory(FakeNvml([H100]).loader))
    assert h100.bandwidth_bytes_per_s == pytest.approx(3.352e12, rel=1e-3)  # the datasheet's 3.35 TB/s
    assert "2619 MHz x 2 (double data rate) x 5120-bit bus" in h100.bandwidth_source
    assert h100.arithmetic_flops_per_s == pytest.approx(989.4e12)
    assert "H100 SXM5 datasheet" in h100.arithmetic_source and "dense" in h100.arithmetic_source


def test_a_part_outside_the_table_gets_nvmls_fp32_rate_and_says_so() -> None:
    odd = GpuInfo(0, "GPU-x", "NVIDIA Future 9000", max_memory_clock_mhz=1000, memory_bus_width_bits=256,
                  max_sm_clock_mhz=2000, cuda_cores=10000)  # fmt: skip
    found = gpu_limits(odd)
    assert found is not None and found.arithmetic_flops_per_s == pytest.approx(4e13)
    assert "no tensor cores" in found.arithmetic_source
    assert gpu_limits(GpuInfo(0, "GPU-y", "NVIDIA Future 9000")) is None  # nothing to tell them from
    table_only = gpu_limits(GpuInfo(0, "GPU-z", "NVIDIA L4"))  # no clocks: the table's bandwidth
    assert table_only is not None and table_only.bandwidth_bytes_per_s == pytest.approx(0.3e12)


@pytest.mark.parametrize(
    ("name", "expected"),
    [("NVIDIA H100 PCIe", 756.0), ("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA A10", 125.0),
     ("NVIDIA A100-SXM4-80GB", 312.0), ("NVIDIA L40S", 362.0), ("NVIDIA L4", 121.0), ("NVIDIA H200", 989.0)],
)  # fmt: skip
def test_the_table_tells_similar_names_apart(name: str, expected: float) -> None:
    part = known_part(name)
    assert part is not None and part.fp16_tensor_tflops == expected
    assert known_part("NVIDIA A10G") is None


def test_each_test_is_set_against_the_device_it_ran_on(tmp_path: Path, fake_toolchain: Toolchain) -> None:
    summary = read_gguf(write_small_gguf(tmp_path / "m.gguf", tied=False))  # 1 block: 2 layers to offload
    cpu = limits(bandwidth_bytes_per_s=50e9, flops_per_s=1e12)
    (gpu,) = gpu_ceilings(lambda: read_gpu_inventory(FakeNvml([H100]).loader))
    speed = captured_speed(fake_toolchain)
    on_cpu = roofline(_on(speed, backends="CPU", n_gpu_layers=999), summary, cpu, (gpu,))
    assert on_cpu.device == "cpu" and on_cpu.bandwidth_bytes_per_s == 50e9
    on_gpu = roofline(_on(speed, backends="CUDA", n_gpu_layers=999), summary, cpu, (gpu,))
    assert on_gpu.device == "gpu" and on_gpu.bandwidth_bytes_per_s == gpu.bandwidth_bytes_per_s
    assert "H100" in on_gpu.device_note
    # a GPU run measured against the GPU's ceiling, far lower a share than against the CPU's
    assert on_gpu.decode.fraction_of_ceiling < on_cpu.decode.fraction_of_ceiling / 10
    asked_none = roofline(_on(speed, backends="CUDA", n_gpu_layers=0), summary, cpu, (gpu,))
    assert asked_none.device == "cpu"
    half = device_ceilings(_on(speed, backends="CUDA", n_gpu_layers=1), summary, cpu, (gpu,))
    assert half.device == "cpu+gpu" and "50% of the layers" in half.note
    assert half.bandwidth_bytes_per_s == pytest.approx(1 / (0.5 / gpu.bandwidth_bytes_per_s + 0.5 / 50e9))
    with pytest.raises(UnknownGpuCeilings, match="limits are not known"):
        roofline(_on(speed, backends="CUDA", n_gpu_layers=999), summary, cpu, ())


def test_layers_split_over_gpus_run_in_turn(tmp_path: Path, fake_toolchain: Toolchain) -> None:
    summary = read_gguf(write_small_gguf(tmp_path / "m.gguf", tied=False))
    slow = GpuInfo(1, "GPU-s", "NVIDIA L4", max_memory_clock_mhz=1000, memory_bus_width_bits=192)
    fast, small = gpu_limits(GpuInfo(0, "GPU-f", "NVIDIA H100", max_memory_clock_mhz=2619,
                                     memory_bus_width_bits=5120)), gpu_limits(slow)  # fmt: skip
    assert fast is not None and small is not None
    both = device_ceilings(_on(captured_speed(fake_toolchain), backends="CUDA", n_gpu_layers=-1), summary,
                           limits(), (fast, small))  # fmt: skip
    halves = 0.5 / fast.bandwidth_bytes_per_s + 0.5 / small.bandwidth_bytes_per_s
    assert both.device == "gpu" and both.bandwidth_bytes_per_s == pytest.approx(1 / halves)
