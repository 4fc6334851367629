"""The part of NVML quantload calls, as a protocol, and the real bindings behind it.

NVML (the NVIDIA Management Library) is reached through `nvidia-ml-py`'s module `pynvml`. Code
takes an `NvmlLoader` (a function returning something shaped like `Nvml`) so that tests pass a fake
(tests/fake_nvml.py) instead of patching the real module. Units are NVML's own: power in
milliwatts, energy in millijoules, clocks in MHz, memory in bytes, bus width in bits.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, cast

NVML_ERROR_NOT_SUPPORTED = 3  # nvml.h's code for a query this GPU cannot answer
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_DEVICE_MIG_ENABLE = 1


class Nvml(Protocol):
    """The `pynvml` names quantload calls (a test passes a fake with the same names)."""

    NVMLError: type[Exception]

    def nvmlInit(self) -> None: ...
    def nvmlShutdown(self) -> None: ...
    def nvmlDeviceGetCount(self) -> int: ...
    def nvmlDeviceGetHandleByIndex(self, index: int) -> Any: ...
    def nvmlDeviceGetUUID(self, handle: Any) -> str: ...
    def nvmlDeviceGetName(self, handle: Any) -> str: ...
    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> Any: ...  # .gpu, percent
    def nvmlDeviceGetMemoryInfo(self, handle: Any) -> Any: ...  # .used, .total, bytes
    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int: ...  # milliwatts
    def nvmlDeviceGetTotalEnergyConsumption(self, handle: Any) -> int: ...  # millijoules
    def nvmlDeviceGetCudaComputeCapability(self, handle: Any) -> tuple[int, int]: ...
    def nvmlDeviceGetPciInfo(self, handle: Any) -> Any: ...  # .busId, e.g. "00000000:3B:00.0"
    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock: int) -> int: ...  # MHz
    def nvmlDeviceGetMemoryBusWidth(self, handle: Any) -> int: ...  # bits
    def nvmlDeviceGetNumGpuCores(self, handle: Any) -> int: ...
    def nvmlDeviceGetMigMode(self, handle: Any) -> tuple[int, int]: ...  # (current, pending)
    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int: ...
    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> Any: ...
    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int: ...  # milliwatts


NvmlLoader = Callable[[], Nvml]


def system_nvml() -> Nvml:
    """The real bindings (`pynvml` from nvidia-ml-py); they load NVML's shared library at nvmlInit."""
    import pynvml

    return cast(Nvml, pynvml)


def not_supported(error: BaseException) -> bool:
    """Whether an NVML error says the GPU cannot answer this query (rather than failing)."""
    return getattr(error, "value", None) == NVML_ERROR_NOT_SUPPORTED


def text(value: object) -> str:
    """An NVML string, which older bindings hand back as bytes."""
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)
