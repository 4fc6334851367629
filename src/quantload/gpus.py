"""The NVIDIA GPUs of this machine as NVML lists them, read once and bounded in time.

What the toolchain (the CUDA architectures to build for), the roofline (a GPU's memory bandwidth
and arithmetic rate) and energy attribution (which card a server's PCI bus id or MIG slice is)
need. Where NVML is missing, fails or sees no GPU, the inventory is empty and says why in words.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from quantload.nvml import (
    NVML_CLOCK_MEM,
    NVML_CLOCK_SM,
    NVML_DEVICE_MIG_ENABLE,
    Nvml,
    NvmlLoader,
    system_nvml,
    text,
)

INVENTORY_TIMEOUT_S = 10.0
_PCI = re.compile(r"^([0-9a-fA-F]+):([0-9a-fA-F]+):([0-9a-fA-F]+)\.([0-9a-fA-F]+)")
T = TypeVar("T")


def normalized_pci_bus_id(bus_id: str) -> str | None:
    """`0000:3b:00.0` for NVML's `00000000:3B:00.0` and CUDA's `0000:3b:00.0` (or `...-v1`)."""
    found = _PCI.match(bus_id.strip())
    if found is None:
        return None
    domain, bus, device, function = (int(part, 16) for part in found.groups())
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function:x}"


@dataclass(frozen=True)
class GpuInfo:
    """One physical GPU: what identifies it and what it can do."""

    index: int
    uuid: str
    name: str
    pci_bus_id: str | None = None
    compute_capability: tuple[int, int] | None = None
    memory_total_bytes: int | None = None
    power_limit_w: float | None = None
    mig_enabled: bool = False
    mig_uuids: tuple[str, ...] = ()
    max_memory_clock_mhz: int | None = None
    memory_bus_width_bits: int | None = None
    max_sm_clock_mhz: int | None = None
    cuda_cores: int | None = None

    @property
    def cuda_architecture(self) -> str | None:
        """The CMake CUDA architecture of this GPU, e.g. `90` for compute capability 9.0."""
        if self.compute_capability is None:
            return None
        major, minor = self.compute_capability
        return f"{major}{minor}"


@dataclass(frozen=True)
class GpuInventory:
    """The GPUs NVML lists here; when there are none, `why_none` says why."""

    gpus: tuple[GpuInfo, ...] = ()
    why_none: str = ""

    def cuda_architectures(self) -> tuple[str, ...]:
        """The distinct architectures of the GPUs found, lowest first (those NVML could tell)."""
        found = {gpu.cuda_architecture for gpu in self.gpus if gpu.cuda_architecture}
        return tuple(sorted(found, key=int))

    def by_uuid(self, uuid: str) -> GpuInfo | None:
        """The GPU with this UUID, or the card that holds the MIG slice with this UUID."""
        for gpu in self.gpus:
            if gpu.uuid == uuid or uuid in gpu.mig_uuids:
                return gpu
        return None

    def by_pci_bus_id(self, bus_id: str) -> GpuInfo | None:
        """The GPU at this PCI address (in NVML's or CUDA's spelling)."""
        wanted = normalized_pci_bus_id(bus_id)
        return next((g for g in self.gpus if wanted and g.pci_bus_id == wanted), None)


def _optional(call: Callable[[], T], nvml: Nvml) -> T | None:
    """A query a GPU may not answer (not supported, or an older driver): None then."""
    try:
        return call()
    except nvml.NVMLError:
        return None
    except AttributeError:  # bindings older than the query
        return None


def _mig_uuids(nvml: Nvml, handle: Any) -> tuple[bool, tuple[str, ...]]:
    mode = _optional(lambda: nvml.nvmlDeviceGetMigMode(handle), nvml)
    if mode is None or mode[0] != NVML_DEVICE_MIG_ENABLE:
        return False, ()
    count = _optional(lambda: nvml.nvmlDeviceGetMaxMigDeviceCount(handle), nvml) or 0
    uuids = []
    for index in range(count):
        slice_handle = _optional(partial(nvml.nvmlDeviceGetMigDeviceHandleByIndex, handle, index), nvml)
        if slice_handle is not None:
            uuids.append(text(nvml.nvmlDeviceGetUUID(slice_handle)))
    return True, tuple(uuids)


def describe_gpu(nvml: Nvml, index: int, handle: Any) -> GpuInfo:
    """What NVML tells of one GPU (an already initialised NVML)."""
    pci = _optional(lambda: nvml.nvmlDeviceGetPciInfo(handle), nvml)
    capability = _optional(lambda: nvml.nvmlDeviceGetCudaComputeCapability(handle), nvml)
    memory = _optional(lambda: nvml.nvmlDeviceGetMemoryInfo(handle), nvml)
    limit_mw = _optional(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle), nvml)
    mig_enabled, mig_uuids = _mig_uuids(nvml, handle)
    memory_clock = _optional(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_MEM), nvml)
    sm_clock = _optional(lambda: nvml.nvmlDeviceGetMaxClockInfo(handle, NVML_CLOCK_SM), nvml)
    return GpuInfo(
        index=index,
        uuid=text(nvml.nvmlDeviceGetUUID(handle)),
        name=text(nvml.nvmlDeviceGetName(handle)),
        pci_bus_id=normalized_pci_bus_id(text(pci.busId)) if pci is not None else None,
        compute_capability=(int(capability[0]), int(capability[1])) if capability else None,
        memory_total_bytes=int(memory.total) if memory is not None else None,
        power_limit_w=limit_mw / 1000.0 if limit_mw else None,
        mig_enabled=mig_enabled,
        mig_uuids=mig_uuids,
        max_memory_clock_mhz=int(memory_clock) if memory_clock else None,
        memory_bus_width_bits=_positive(_optional(lambda: nvml.nvmlDeviceGetMemoryBusWidth(handle), nvml)),
        max_sm_clock_mhz=int(sm_clock) if sm_clock else None,
        cuda_cores=_positive(_optional(lambda: nvml.nvmlDeviceGetNumGpuCores(handle), nvml)),
    )


def _positive(value: int | None) -> int | None:
    return int(value) if value else None


def _read(nvml: Nvml) -> GpuInventory:
    nvml.nvmlInit()
    try:
        gpus = tuple(
            describe_gpu(nvml, index, nvml.nvmlDeviceGetHandleByIndex(index))
            for index in range(nvml.nvmlDeviceGetCount())
        )
    finally:
        nvml.nvmlShutdown()
    return GpuInventory(gpus, "" if gpus else "NVML initialised but lists no GPU")


def _bounded(call: Callable[[], GpuInventory], timeout_s: float) -> GpuInventory:
    box: dict[str, GpuInventory | BaseException] = {}

    def work() -> None:
        try:
            box["result"] = call()
        except Exception as error:  # handed back as the reason
            box["result"] = error

    thread = threading.Thread(target=work, name="quantload-gpu-inventory", daemon=True)
    thread.start()
    thread.join(timeout_s)
    result = box.get("result")
    if result is None:
        return GpuInventory((), f"NVML did not answer within {timeout_s:g} s")
    if isinstance(result, BaseException):
        return GpuInventory((), f"NVML is not available here ({type(result).__name__}: {result})")
    return result


def read_gpu_inventory(
    loader: NvmlLoader = system_nvml, timeout_s: float = INVENTORY_TIMEOUT_S
) -> GpuInventory:
    """The GPUs of this machine, or an empty inventory saying why there are none."""
    try:
        nvml = loader()
    except ImportError as error:
        return GpuInventory((), f"the NVML bindings cannot be imported ({error})")
    return _bounded(lambda: _read(nvml), timeout_s)


@dataclass(frozen=True)
class FixedInventory:
    """An inventory decided in advance (a caller that already read one, or a test)."""

    inventory: GpuInventory = field(default_factory=GpuInventory)

    def __call__(self) -> GpuInventory:
        return self.inventory


InventoryReader = Callable[[], GpuInventory]
