"""Where a mixture of experts' expert tensors live: one setting, in llama-server's flags.

    none            llama.cpp's own placement
    cpu-moe         --cpu-moe: every layer's experts in host memory, the rest offloaded
    n-cpu-moe:N     --n-cpu-moe N: the first N layers' experts in host memory
    ot:PAT=BUF,...  --override-tensor PAT=BUF,... (e.g. ot:exps=CPU)

Placement moves experts off a device onto the CPU, so it means something only where the
llama-server sees a device besides the CPU (a GPU, or an RPC host: quantload.llamacpp.devices). On
a CPU-only machine every tensor is on the CPU already: `check_placement` refuses the setting in
one line before any server starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from quantload.errors import ConfigError

if TYPE_CHECKING:  # the settings read this module, and devices reads the settings' toolchain
    from quantload.llamacpp.devices import Device

NONE = "none"
PLACEMENT_FORMS = "none, cpu-moe, n-cpu-moe:N or ot:PATTERN=BUFFER[,PATTERN=BUFFER]"


def placement_args(placement: str) -> tuple[str, ...]:
    """The llama-server flags of `placement`; ValueError naming the forms for anything else."""
    kind, _, value = placement.strip().partition(":")
    if kind == NONE and not value:
        return ()
    if kind == "cpu-moe" and not value:
        return ("--cpu-moe",)
    if kind == "n-cpu-moe" and value.isdigit():
        return ("--n-cpu-moe", str(int(value)))
    if kind == "ot" and value and all(_override(item) for item in value.split(",")):
        return ("--override-tensor", value)
    raise ValueError(f"{placement!r} is no expert placement: use {PLACEMENT_FORMS}")


def _override(item: str) -> bool:
    pattern, eq, buffer = item.partition("=")
    return bool(pattern and eq and buffer and " " not in item)


def check_placement(asked: Sequence[tuple[str, str]], devices: Sequence[Device]) -> None:
    """ConfigError when a placement other than none is asked ((setting, value) pairs) and the
    server sees no device besides the CPU."""
    placed = [(setting, value) for setting, value in asked if placement_args(value)]
    if not placed or devices:
        return
    setting, value = placed[0]
    raise ConfigError(
        f"{setting} = {value!r} keeps experts in host memory, but this llama-server sees no device"
        " besides the CPU, so every tensor is there already",
        f"set {setting} to none on a CPU-only machine, or serve with a GPU build or server.rpc hosts",
    )
