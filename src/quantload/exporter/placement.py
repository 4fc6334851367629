"""Where one server's model sits: its layers on the GPU and which GPUs, from its log or its target.

The server's log is followed from where the last read stopped (at most LOG_CHUNK_BYTES a scrape,
whole lines only; a log that shrank is read again from its start), so a restart that appends to
the same log shows its new placement. Each model load logs the devices it uses (`using device
CUDA0 (...) (0000:3b:00.0) - ... MiB free`) and then `offloaded N/M layers to GPU`; the latest
load wins. A device's PCI address is matched to the GPU NVML lists at that address; a target's
`gpus=` option (NVML indexes, GPU or MIG UUIDs) names them instead, where the log cannot be read
(Kubernetes: the log stays in the server's pod).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from quantload.gpus import GpuInfo, GpuInventory
from quantload.llamacpp.offload import OffloadLog, UsedDevice, parse_offload

LOG_CHUNK_BYTES = 1024 * 1024


@dataclass(frozen=True)
class ServerGpu:
    """One GPU a server uses, as the exporter labels it."""

    gpu: GpuInfo
    source: str  # "log" or "target"

    @property
    def labels(self) -> dict[str, str]:
        return {
            "gpu": str(self.gpu.index),
            "uuid": self.gpu.uuid,
            "mig": "yes" if self.gpu.mig_enabled else "no",
            "source": self.source,
        }


@dataclass
class LogFollower:
    """Reads a growing log a chunk at a time and keeps the latest model load's placement."""

    path: Path
    offset: int = 0
    partial: str = ""
    placement: OffloadLog = field(default_factory=OffloadLog)
    _devices: dict[str, UsedDevice] = field(default_factory=dict)

    def follow(self) -> OffloadLog:
        """Read what was appended since the last call (bounded) and return the placement."""
        try:
            size = os.stat(self.path).st_size
            if size < self.offset:  # a new log under the same name
                self.offset, self.partial, self._devices = 0, "", {}
            with self.path.open("rb") as log:
                log.seek(self.offset)
                chunk = log.read(LOG_CHUNK_BYTES)
        except OSError:
            return self.placement
        self.offset += len(chunk)
        text = self.partial + chunk.decode("utf-8", errors="replace")
        lines, _, self.partial = text.rpartition("\n")
        for line in lines.splitlines():
            self._take(line)
        return self.placement

    def _take(self, line: str) -> None:
        found = parse_offload(line)
        for device in found.devices:
            if found.offloaded is None and device.name in self._devices:  # a later load
                self._devices = {}
            self._devices[device.name] = device
        if found.offloaded is not None:
            self.placement = OffloadLog(found.offloaded, found.layers, tuple(self._devices.values()))
            self._devices = {}


def gpus_named(names: Sequence[str], inventory: GpuInventory) -> tuple[GpuInfo, ...]:
    """The GPUs a target's `gpus=` option names: NVML indexes, GPU UUIDs or MIG UUIDs (a MIG
    slice counts as its card); names NVML does not list are left out."""
    found: list[GpuInfo] = []
    for name in names:
        gpu = inventory.gpus[int(name)] if name.isdigit() and int(name) < len(inventory.gpus) else None
        gpu = gpu or inventory.by_uuid(name)
        if gpu is not None and gpu not in found:
            found.append(gpu)
    return tuple(found)


def server_gpus(
    placement: OffloadLog, named: Sequence[str], inventory: GpuInventory
) -> tuple[ServerGpu, ...]:
    """The GPUs one server uses: those its target names, else those its log's placement shows
    (none when it offloaded no layer)."""
    if named:
        return tuple(ServerGpu(gpu, "target") for gpu in gpus_named(named, inventory))
    if not placement.offloaded:
        return ()
    used = (inventory.by_pci_bus_id(device.pci_bus_id) for device in placement.devices)
    unique = {gpu.uuid: gpu for gpu in used if gpu is not None}
    return tuple(ServerGpu(gpu, "log") for gpu in unique.values())
