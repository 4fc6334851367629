"""How many layers a llama.cpp tool was asked to put on the GPU, and how many its log says it did.

`server.gpu_layers` is `auto` (llama.cpp fits what free device memory holds), `all`, or a number
(0 keeps every layer on the CPU, passed explicitly: a CUDA build's own default is `auto`). It
reaches llama-server and llama-perplexity as `-ngl auto|all|N`; llama-bench has no `auto` and
takes `-ngl 999` for `auto` and `all` (every layer: its own default), or the number.

A model loaded by a build with a GPU backend logs `load_tensors: offloaded N/M layers to GPU` (M
is the repeating layers plus the output layer) and, per device it uses, `using device CUDA0
(NVIDIA H100 80GB HBM3) (0000:3b:00.0) - 80000 MiB free`; a CPU-only build logs neither.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Literal

GpuLayers = int | Literal["auto", "all"]
BENCH_ALL_LAYERS = 999  # llama-bench: at least every layer (llama.cpp caps it at the model's)
_OFFLOADED = re.compile(r"offloaded (\d+)/(\d+) layers to GPU")
_DEVICE = re.compile(r"using device (\S+) \((.*)\) \(([^)]*)\) - (\d+) MiB free")

Verdict = Literal["as asked", "fewer than asked", "on the CPU", "not logged"]


def gpu_layers_flag(value: GpuLayers) -> str:
    """The `-ngl` value of llama-server and llama-perplexity."""
    return str(value)


def bench_gpu_layers_flag(value: GpuLayers) -> str:
    """The `-ngl` value of llama-bench, which knows no `auto` or `all`."""
    return str(BENCH_ALL_LAYERS) if value in ("auto", "all") else str(value)


def gpu_layer_args(tool: str, value: GpuLayers | None) -> list[str]:
    """`-ngl` and its value for `tool` (nothing for `None`, or a tool that loads no model)."""
    if value is None or tool == "llama-quantize":
        return []
    flag = bench_gpu_layers_flag(value) if tool == "llama-bench" else gpu_layers_flag(value)
    return ["-ngl", flag]


@dataclass(frozen=True)
class UsedDevice:
    """A GPU the model was loaded onto, as llama.cpp named it."""

    name: str  # CUDA0
    description: str  # NVIDIA H100 80GB HBM3
    pci_bus_id: str  # 0000:3b:00.0 (or "unknown id")
    free_mib: int


@dataclass(frozen=True)
class OffloadLog:
    """What a log says of layer placement: the last model load's counts and devices."""

    offloaded: int | None = None
    layers: int | None = None
    devices: tuple[UsedDevice, ...] = field(default_factory=tuple)


def parse_offload(log_text: str) -> OffloadLog:
    """The last `offloaded N/M layers` line and the devices listed before it (one model load)."""
    counts = list(_OFFLOADED.finditer(log_text))
    if not counts:
        return OffloadLog(devices=_devices(log_text))
    last = counts[-1]
    start = counts[-2].end() if len(counts) > 1 else 0
    return OffloadLog(int(last.group(1)), int(last.group(2)), _devices(log_text[start : last.start()]))


def _devices(text: str) -> tuple[UsedDevice, ...]:
    found: dict[str, UsedDevice] = {}
    for match in _DEVICE.finditer(text):
        name, description, bus_id, free = match.groups()
        found[name] = UsedDevice(name, description, bus_id, int(free))
    return tuple(found.values())


@dataclass(frozen=True)
class OffloadCheck:
    """The layers asked for against those the log says were offloaded, in one verdict and line."""

    requested: str
    offloaded: int | None
    layers: int | None
    devices: tuple[UsedDevice, ...]
    verdict: Verdict
    line: str

    @property
    def on_gpu(self) -> bool:
        """Whether any layer is on a GPU (a device the log lists, not only llama.cpp's count)."""
        return bool(self.offloaded) and bool(self.devices)

    def to_json(self) -> dict[str, object]:
        return {
            "requested": self.requested,
            "offloaded": self.offloaded,
            "layers": self.layers,
            "devices": [vars(device) for device in self.devices],
            "verdict": self.verdict,
            "line": self.line,
        }


def check_offload(requested: GpuLayers, log: OffloadLog) -> OffloadCheck:
    """Whether the log shows the layers `requested`: `all` wants N = M, a number k wants
    min(k, M), 0 wants none, `auto` takes what llama.cpp fitted (any N, said)."""
    asked = gpu_layers_flag(requested)

    def made(verdict: Verdict, line: str) -> OffloadCheck:
        return OffloadCheck(asked, log.offloaded, log.layers, log.devices, verdict, line)

    if log.offloaded is None or log.layers is None:
        if requested == 0:
            return made("on the CPU", "asked for 0 GPU layers; every layer on the CPU")
        return made(
            "on the CPU",
            f"asked for {asked} GPU layers, but this llama.cpp has no GPU backend (no 'offloaded"
            " N/M layers' line): every layer ran on the CPU",
        )
    counts = f"{log.offloaded}/{log.layers} layers offloaded"
    if log.offloaded and not log.devices:  # a build with a non-GPU backend (RPC) counts its layers so
        return made(
            "fewer than asked" if requested not in (0, "auto") else "on the CPU",
            f"{counts} by llama.cpp's count, but it used no GPU device (none listed in its log):"
            " every layer on the CPU",
        )
    where = f" to {', '.join(d.name for d in log.devices)}"
    if log.offloaded == 0:
        wanted_none = requested == 0
        why = "as asked" if wanted_none else f"asked for {asked}"
        return made("on the CPU" if wanted_none else "fewer than asked", f"{counts} ({why}): on the CPU")
    if requested == "auto":
        return made("as asked", f"{counts}{where} (auto: what fitted in device memory)")
    expected = log.layers if requested == "all" else min(int(requested), log.layers)
    if log.offloaded < expected:
        return made(
            "fewer than asked",
            f"{counts}{where}, fewer than the {expected} asked ({asked}): the rest ran on the CPU",
        )
    return made("as asked", f"{counts}{where} (asked for {asked})")


def not_logged(requested: GpuLayers, why: str) -> OffloadCheck:
    """A check that could not read the log."""
    return OffloadCheck(gpu_layers_flag(requested), None, None, (), "not logged", why)
