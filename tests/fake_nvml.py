"""A fake NVML for tests: the `pynvml` names quantload calls, over GPUs a test scripts.

Passed to the exporter as its NVML loader (`nvml=FakeNvml(...).loader`), never patched into the
real module. Values are in NVML's own units: utilisation in percent, memory in bytes, power in
milliwatts, energy in millijoules, clocks in MHz, bus width in bits (the energy counter advances by `power_mw` x the wall time
between reads, as a real one does).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

NOT_SUPPORTED = 3
LIBRARY_NOT_FOUND = 12
GPU_IS_LOST = 15


class FakeNvmlError(Exception):
    """pynvml.NVMLError's shape: an exception carrying NVML's return code as `value`."""

    def __init__(self, value: int) -> None:
        super().__init__(f"fake NVML error {value}")
        self.value = value


@dataclass
class FakeGpu:
    """One scripted GPU."""

    name: str = "NVIDIA Fake 80GB"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    utilization_percent: int = 40
    memory_used_bytes: int = 2 * 1024**3
    memory_total_bytes: int = 80 * 1024**3
    power_mw: int = 150_000
    energy_mj: int = 1_000_000
    compute_capability: tuple[int, int] = (9, 0)
    pci_bus_id: str = "00000000:3B:00.0"  # NVML's spelling
    max_memory_clock_mhz: int = 2619
    memory_bus_width_bits: int = 5120
    max_sm_clock_mhz: int = 1980
    cuda_cores: int = 16896
    power_limit_mw: int = 700_000
    mig_uuids: tuple[str, ...] = ()  # MIG slices: MIG mode is on when there are any
    unsupported: set[str] = field(default_factory=set)  # e.g. {"energy"}
    failing: dict[str, int] = field(default_factory=dict)  # quantity -> NVML error code
    _last_energy_read_s: float | None = None

    def energy_now(self) -> int:
        now = time.monotonic()
        if self._last_energy_read_s is not None:
            self.energy_mj += round(self.power_mw * (now - self._last_energy_read_s))
        self._last_energy_read_s = now
        return self.energy_mj


class FakeNvml:
    """What `quantload.exporter.gpu.Nvml` needs, over `gpus`; counts calls, can fail or hang."""

    NVMLError = FakeNvmlError

    def __init__(
        self,
        gpus: list[FakeGpu] | None = None,
        init_error: int | None = None,
        hang_init: bool = False,
    ) -> None:
        self.gpus = gpus if gpus is not None else [FakeGpu()]
        self.init_error = init_error
        self.hang_init = hang_init
        self.release = threading.Event()  # set it to let a hung call return
        self.hang_power = False
        self.power_reads = 0
        self.initialised = False
        self.shutdowns = 0

    def loader(self) -> FakeNvml:
        """The loader the exporter calls (as `quantload.nvml.system_nvml` is)."""
        return self

    # ---- the pynvml names
    def nvmlInit(self) -> None:
        if self.hang_init:
            self.release.wait(30)
        if self.init_error is not None:
            raise FakeNvmlError(self.init_error)
        self.initialised = True

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1
        self.initialised = False

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        return self.gpus[index]

    def nvmlDeviceGetUUID(self, handle: FakeGpu) -> str:
        return handle.uuid

    def nvmlDeviceGetName(self, handle: FakeGpu) -> str:
        return handle.name

    def nvmlDeviceGetUtilizationRates(self, handle: FakeGpu) -> Any:
        self._check(handle, "utilization")
        return SimpleNamespace(gpu=handle.utilization_percent, memory=10)

    def nvmlDeviceGetMemoryInfo(self, handle: FakeGpu) -> Any:
        self._check(handle, "memory")
        used, total = handle.memory_used_bytes, handle.memory_total_bytes
        return SimpleNamespace(used=used, total=total, free=total - used)

    def nvmlDeviceGetPowerUsage(self, handle: FakeGpu) -> int:
        self.power_reads += 1
        if self.hang_power:
            self.release.wait(30)
        self._check(handle, "power")
        return handle.power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: FakeGpu) -> int:
        self._check(handle, "energy")
        return handle.energy_now()

    def nvmlDeviceGetCudaComputeCapability(self, handle: FakeGpu) -> tuple[int, int]:
        self._check(handle, "compute_capability")
        return handle.compute_capability

    def nvmlDeviceGetPciInfo(self, handle: FakeGpu) -> Any:
        self._check(handle, "pci")
        return SimpleNamespace(busId=handle.pci_bus_id.encode())  # older bindings give bytes

    def nvmlDeviceGetMaxClockInfo(self, handle: FakeGpu, clock: int) -> int:
        self._check(handle, "clocks")
        return {1: handle.max_sm_clock_mhz, 2: handle.max_memory_clock_mhz}[clock]

    def nvmlDeviceGetMemoryBusWidth(self, handle: FakeGpu) -> int:
        self._check(handle, "bus_width")
        return handle.memory_bus_width_bits

    def nvmlDeviceGetNumGpuCores(self, handle: FakeGpu) -> int:
        self._check(handle, "cores")
        return handle.cuda_cores

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: FakeGpu) -> int:
        self._check(handle, "power_limit")
        return handle.power_limit_mw

    def nvmlDeviceGetMigMode(self, handle: FakeGpu) -> tuple[int, int]:
        self._check(handle, "mig")
        mode = 1 if handle.mig_uuids else 0
        return mode, mode

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: FakeGpu) -> int:
        self._check(handle, "mig")
        return len(handle.mig_uuids)

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: FakeGpu, index: int) -> FakeGpu:
        self._check(handle, "mig")
        return FakeGpu(name=f"{handle.name} MIG {index}", uuid=handle.mig_uuids[index])

    def _check(self, handle: FakeGpu, quantity: str) -> None:
        if not self.initialised:
            raise FakeNvmlError(1)  # NVML_ERROR_UNINITIALIZED
        if quantity in handle.unsupported:
            raise FakeNvmlError(NOT_SUPPORTED)
        if quantity in handle.failing:
            raise FakeNvmlError(handle.failing[quantity])


def failing_import() -> Callable[[], Any]:
    """A loader that fails the way a missing nvidia-ml-py would."""

    def load() -> Any:
        raise ImportError("No module named 'pynvml'")

    return load
