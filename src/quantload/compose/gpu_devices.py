"""Which GPU each compose server reserves: one each while there are enough, then in turn.

docker-compose.gpu.yml reserves `QL_GPU_DEVICE_<QUANT>` for the server of each quantization (a
device id: an NVML index or a GPU UUID). Compose has no way to count the GPUs itself (a `count: 1`
reservation always means GPU 0), so `quantload stack gpus` reads them through NVML and prints the
lines for `.env`: F16, Q8_0 and Q4_K_M on GPUs 0, 1 and 2 where three are there; with fewer, they
share in turn, and a line says so.
"""

from __future__ import annotations

from collections.abc import Sequence

from quantload.errors import ConfigError
from quantload.gpus import GpuInventory

COMPOSE_QUANTS: tuple[str, ...] = ("F16", "Q8_0", "Q4_K_M")


def device_variable(quant: str) -> str:
    """The .env variable of one quantization's GPU, e.g. QL_GPU_DEVICE_Q4_K_M."""
    return f"QL_GPU_DEVICE_{quant.upper()}"


def assign_gpus(inventory: GpuInventory, quants: Sequence[str] = COMPOSE_QUANTS) -> list[str]:
    """`.env` lines giving each quantization's server a GPU, one each where there are enough;
    comment lines say when they share. ConfigError when NVML lists no GPU."""
    gpus = [gpu for gpu in inventory.gpus if not gpu.mig_enabled] or list(inventory.gpus)
    if not gpus:
        raise ConfigError(
            f"no GPU to give the servers: {inventory.why_none}",
            "run it where the GPUs are: on the GPU box, or in the GPU override's exporter container",
        )
    lines = [f"# {len(gpus)} GPU(s) for {len(quants)} servers (quantload stack gpus)"]
    if len(gpus) < len(quants):
        lines.append("# fewer GPUs than servers: they share in turn, and share each GPU's energy")
    for position, quant in enumerate(quants):
        gpu = gpus[position % len(gpus)]
        lines.append(f"# {quant}: GPU {gpu.index}, {gpu.name} {gpu.uuid}")
        lines.append(f"{device_variable(quant)}={gpu.index}")
    return lines
