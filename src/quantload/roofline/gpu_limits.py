"""A GPU's memory bandwidth and peak arithmetic rate, for the roofline of what ran on it.

Bandwidth comes from NVML: the maximum memory clock x 2 (NVML reports the clock of double-data-rate
memory, HBM and GDDR alike) x the bus width in bytes. That gives the datasheet figure (H100 SXM:
2,619 MHz x 2 x 5,120 bits = 3.35 TB/s; A100 40GB: 1,215 MHz x 2 x 5,120 bits = 1.56 TB/s).

Arithmetic comes from a table of known parts: the dense FP16 tensor-core rate of NVIDIA's
datasheets (no sparsity), the rate llama.cpp's matrix kernels can reach for prefill. A part not in
the table gets NVML's CUDA cores x maximum SM clock x 2 (fused multiply-add): the FP32 rate without
tensor cores, which prefill can pass, and the source says so. A part NVML tells no clocks of takes
the table's bandwidth.

These are datasheet peaks, not probes: quantload carries no CUDA library to time a copy with, so
the GPU's measured share of its ceiling says how near llama.cpp came to the peak.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from quantload.gpus import GpuInfo, InventoryReader

TERA = 1e12


@dataclass(frozen=True)
class KnownPart:
    """One GPU model's datasheet figures."""

    pattern: str  # matched against NVML's name, case-insensitive
    fp16_tensor_tflops: float  # dense
    bandwidth_tb_per_s: float
    datasheet: str


# Longer names first: "H100 PCIe" before "H100", "L40S" before "L40" before "L4".
KNOWN_PARTS: tuple[KnownPart, ...] = (
    KnownPart(r"H200 NVL", 835.0, 4.8, "NVIDIA H200 NVL datasheet"),
    KnownPart(r"H200", 989.0, 4.8, "NVIDIA H200 SXM datasheet"),
    KnownPart(r"H100 NVL", 835.0, 3.9, "NVIDIA H100 NVL datasheet"),
    KnownPart(r"H100 PCIe", 756.0, 2.0, "NVIDIA H100 PCIe datasheet"),
    KnownPart(r"H100", 989.4, 3.35, "NVIDIA H100 SXM5 datasheet"),
    KnownPart(r"A100.*80GB", 312.0, 2.039, "NVIDIA A100 80GB datasheet"),
    KnownPart(r"A100", 312.0, 1.555, "NVIDIA A100 40GB datasheet"),
    KnownPart(r"L40S", 362.0, 0.864, "NVIDIA L40S datasheet"),
    KnownPart(r"L40\b", 181.0, 0.864, "NVIDIA L40 datasheet"),
    KnownPart(r"\bL4\b", 121.0, 0.300, "NVIDIA L4 datasheet"),
    KnownPart(r"\bA10\b", 125.0, 0.600, "NVIDIA A10 datasheet"),
    KnownPart(r"\bT4\b", 65.0, 0.320, "NVIDIA T4 datasheet"),
    KnownPart(r"V100", 125.0, 0.900, "NVIDIA V100 SXM2 datasheet"),
)


def known_part(name: str) -> KnownPart | None:
    """The table's entry for a GPU by NVML's name, or None."""
    return next((part for part in KNOWN_PARTS if re.search(part.pattern, name, re.IGNORECASE)), None)


class GpuLimits(BaseModel):
    """One GPU's ceilings and where each figure comes from."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    index: int
    uuid: str
    name: str
    bandwidth_bytes_per_s: float
    bandwidth_source: str
    arithmetic_flops_per_s: float
    arithmetic_source: str
    memory_total_bytes: int | None = Field(default=None, description="as NVML tells")

    @property
    def balance_flops_per_byte(self) -> float:
        return self.arithmetic_flops_per_s / self.bandwidth_bytes_per_s


def _bandwidth(gpu: GpuInfo, part: KnownPart | None) -> tuple[float, str] | None:
    if gpu.max_memory_clock_mhz and gpu.memory_bus_width_bits:
        rate = gpu.max_memory_clock_mhz * 1e6 * 2 * gpu.memory_bus_width_bits / 8
        how = (
            f"NVML: max memory clock {gpu.max_memory_clock_mhz} MHz x 2 (double data rate) x"
            f" {gpu.memory_bus_width_bits}-bit bus"
        )
        return rate, how
    if part is not None:
        return part.bandwidth_tb_per_s * TERA, f"{part.datasheet} ({part.bandwidth_tb_per_s:g} TB/s)"
    return None


def _arithmetic(gpu: GpuInfo, part: KnownPart | None) -> tuple[float, str] | None:
    if part is not None:
        how = f"{part.datasheet}: FP16 tensor cores, {part.fp16_tensor_tflops:g} TFLOP/s dense"
        return part.fp16_tensor_tflops * TERA, how
    if gpu.cuda_cores and gpu.max_sm_clock_mhz:
        rate = gpu.cuda_cores * gpu.max_sm_clock_mhz * 1e6 * 2
        how = (
            f"NVML: {gpu.cuda_cores} CUDA cores x max SM clock {gpu.max_sm_clock_mhz} MHz x 2 (FP32,"
            " no tensor cores: prefill on tensor cores can pass it; the part is not in quantload's table)"
        )
        return rate, how
    return None


def gpu_limits(gpu: GpuInfo) -> GpuLimits | None:
    """The ceilings of `gpu`, or None where neither NVML nor the table tells both figures."""
    part = known_part(gpu.name)
    bandwidth, arithmetic = _bandwidth(gpu, part), _arithmetic(gpu, part)
    if bandwidth is None or arithmetic is None:
        return None
    return GpuLimits(
        index=gpu.index,
        uuid=gpu.uuid,
        name=gpu.name,
        bandwidth_bytes_per_s=bandwidth[0],
        bandwidth_source=bandwidth[1],
        arithmetic_flops_per_s=arithmetic[0],
        arithmetic_source=arithmetic[1],
        memory_total_bytes=gpu.memory_total_bytes,
    )


def gpu_ceilings(inventory: InventoryReader) -> tuple[GpuLimits, ...]:
    """The limits of every GPU NVML lists here that quantload can tell them for."""
    found = (gpu_limits(gpu) for gpu in inventory().gpus)
    return tuple(limits for limits in found if limits is not None)
