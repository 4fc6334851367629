"""`gpu.json`: where each server's layers were (the offload check) and the GPUs' idle baselines.

Schema `quantload.gpu/1`::

    {
      "schema": "quantload.gpu/1",
      "offload": {"Q4_K_M": {"requested": "all", "offloaded": 25, "layers": 25,
                             "devices": [{"name": "CUDA0", "description": ..., "pci_bus_id": ...,
                                          "free_mib": ...}],
                             "verdict": "as asked" | "fewer than asked" | "on the CPU" | "not logged",
                             "line": "25/25 layers offloaded to CUDA0 (asked for all)"}},
      "idle": [{"quants": ["F16", ...], "start_unix_s": ..., "end_unix_s": ...}]
    }

The offload check is filed by the run for each server it starts (llamacpp.offload); an idle
window is the span just before a load in which the servers were up and sent nothing: the GPUs'
draw then is what they cost doing nothing (analysis.gpu_energy).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from quantload.llamacpp.offload import OffloadCheck
from quantload.rundir import read_json, write_json_atomic

GPU_SCHEMA: Final = "quantload.gpu/1"


class IdleWindow(BaseModel):
    """A span in which the named quantizations' servers were up and idle."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    quants: tuple[str, ...]
    start_unix_s: float
    end_unix_s: float

    @property
    def length_s(self) -> float:
        return self.end_unix_s - self.start_unix_s


class GpuFile(BaseModel):
    """The whole gpu.json."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    schema_id: Literal["quantload.gpu/1"] = Field(default=GPU_SCHEMA, alias="schema")
    offload: dict[str, dict[str, Any]] = Field(default_factory=dict)
    idle: tuple[IdleWindow, ...] = ()

    def offloaded(self, quant: str) -> int | None:
        """Layers the quantization's server put on a GPU, where its log said."""
        entry = self.offload.get(quant, {})
        value = entry.get("offloaded")
        return int(value) if isinstance(value, int) else None

    def idle_before(self, quant: str, start_unix_s: float) -> IdleWindow | None:
        """The latest idle window of `quant`'s server that ended by `start_unix_s`."""
        earlier = [w for w in self.idle if quant in w.quants and w.end_unix_s <= start_unix_s + 1e-6]
        return max(earlier, key=lambda w: w.end_unix_s, default=None)

    def to_json(self) -> dict[str, Any]:
        return self.model_dump(mode="json", by_alias=True)


def load_gpu_file(path: Path) -> GpuFile:
    """Read a gpu.json; ValueError when it is not one."""
    try:
        return GpuFile.model_validate(read_json(path))
    except ValidationError as error:
        raise ValueError(f"{path} is not a {GPU_SCHEMA} file: {str(error).splitlines()[0]}") from None


def _current(path: Path) -> GpuFile:
    if not path.is_file():
        return GpuFile()
    try:
        return load_gpu_file(path)
    except (OSError, ValueError):
        return GpuFile()


def merge_offload(path: Path, label: str, check: OffloadCheck) -> None:
    """File one server's offload check under `label` (replacing an earlier one)."""
    current = _current(path)
    updated = current.model_copy(update={"offload": {**current.offload, label: check.to_json()}})
    write_json_atomic(path, updated.to_json())


def add_idle_window(path: Path, window: IdleWindow) -> None:
    """File one idle window."""
    current = _current(path)
    write_json_atomic(path, current.model_copy(update={"idle": (*current.idle, window)}).to_json())


def watch_idle(
    quants: Sequence[str],
    seconds: float,
    out: Path,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> IdleWindow:
    """Let the servers of `quants` sit idle for `seconds` (nothing is sent to them) and file the
    span in gpu.json (`out`): the GPUs' draw then is their idle baseline (analysis.gpu_energy)."""
    start = clock()
    sleep(seconds)
    window = IdleWindow(quants=tuple(quants), start_unix_s=start, end_unix_s=clock())
    add_idle_window(out, window)
    return window
