"""The metrics the exporter makes itself (llama-server's own are in server_metrics.RENAMES).

Every series carries `server`, `quant` and `model` labels except the exporter's scrape duration and
the GPU series (`quantload_gpu_*`, from NVML when the exporter's machine has one), which carry
`gpu` (the NVML index), `uuid` and `gpu_name` instead: a GPU is not one server's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True)
class MetricSpec:
    """Name, type and help text of one exported metric."""

    name: str
    kind: Literal["counter", "gauge"]
    doc: str


TARGET_UP = MetricSpec(
    "quantload_target_up", "gauge", "1 when the server's /metrics was read and parsed, else 0"
)
TARGET_SCRAPE_DURATION = MetricSpec(
    "quantload_target_scrape_duration_seconds",
    "gauge",
    "Seconds spent reading this server's /metrics and /slots during the scrape",
)
TARGET_SCRAPE_ERRORS = MetricSpec(  # + endpoint, error
    "quantload_target_scrape_errors_total",
    "counter",
    "Failed reads of a server endpoint, by endpoint and error class",
)
TARGET_INFO = MetricSpec(  # + url, kv_cells_source
    "quantload_target_info", "gauge", "Where the server is and how its KV cells are known (1)"
)
TARGET_MODEL_BYTES = MetricSpec(
    "quantload_target_model_bytes", "gauge", "Bytes of the served model's tensors (/v1/models meta.size)"
)
SLOTS = MetricSpec("quantload_server_slots", "gauge", "Slots the server runs")
SLOTS_BUSY = MetricSpec("quantload_server_slots_busy", "gauge", "Slots processing a request")
SLOT_TOKENS = MetricSpec(  # + slot
    "quantload_server_slot_tokens",
    "gauge",
    "Tokens the slot holds in the KV cache (its prompt plus the tokens generated so far)",
)
KV_TOKENS = MetricSpec(  # + state=busy|idle
    "quantload_server_kv_tokens",
    "gauge",
    "Tokens held in the KV cache by busy or idle slots (an idle slot keeps its last sequence)",
)
KV_CELLS = MetricSpec("quantload_server_kv_cells", "gauge", "KV cells the server allocated")
KV_CELLS_USED_RATIO = MetricSpec(
    "quantload_server_kv_cells_used_ratio",
    "gauge",
    "KV cells in use (tokens held by every slot) over KV cells allocated",
)
EXPORTER_SCRAPE_DURATION = MetricSpec(
    "quantload_exporter_scrape_duration_seconds",
    "gauge",
    "Seconds the exporter took to read every target for this scrape",
)

# Per GPU, read from NVML on every scrape (exporter/gpu.py); absent where NVML or a GPU is missing.
GPU_PREFIX = "quantload_gpu_"
GPU_UTILIZATION_RATIO = MetricSpec(
    "quantload_gpu_utilization_ratio",
    "gauge",
    "Fraction of the last sample period in which a kernel ran on the GPU (NVML utilization.gpu / 100)",
)
GPU_MEMORY_USED = MetricSpec("quantload_gpu_memory_used_bytes", "gauge", "GPU memory in use, bytes")
GPU_MEMORY_TOTAL = MetricSpec("quantload_gpu_memory_total_bytes", "gauge", "GPU memory installed, bytes")
GPU_POWER = MetricSpec("quantload_gpu_power_watts", "gauge", "Power the GPU draws now, watts (NVML)")
GPU_ENERGY = MetricSpec(
    "quantload_gpu_energy_joules_total",
    "counter",
    "Energy the GPU consumed since its driver was loaded, joules (NVML total energy consumption)",
)
GPU_POWER_LIMIT = MetricSpec(
    "quantload_gpu_power_limit_watts", "gauge", "The power limit the driver enforces, watts (NVML)"
)
GPU_MIG_ENABLED = MetricSpec(
    "quantload_gpu_mig_enabled",
    "gauge",
    "1 when the GPU is split into MIG slices: its power and energy are the whole card's, all slices'",
)

# Per server, from its log (and the exporter's NVML): where its layers are. `quantload_server_*`
# labels plus, for the GPU info, `gpu`, `uuid`, `mig` (yes|no) and `source` (log|target).
SERVER_GPU_INFO = MetricSpec(
    "quantload_server_gpu_info",
    "gauge",
    "1 for each GPU the server's model is loaded on (its log's PCI address, or the target's gpus=)",
)
SERVER_OFFLOADED_LAYERS = MetricSpec(
    "quantload_server_offloaded_layers", "gauge", "Layers the server put on a GPU (its log's N of N/M)"
)
SERVER_OFFLOADABLE_LAYERS = MetricSpec(
    "quantload_server_offloadable_layers",
    "gauge",
    "Layers the server's model has to offload, the output layer included (its log's M of N/M)",
)
