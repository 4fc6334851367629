"""The Prometheus exporter for llama-servers.

It reads each configured llama-server's `/metrics` and `/slots` on every scrape and re-exports
them, renamed and labelled with `server`, `quant` and `model`, plus slot usage, KV-cache occupancy
and per-target health. Targets come from configuration only: nothing in a scrape request can make
it fetch another URL.

llama-server's throughput gauges reset on every read of its `/metrics`, so the exporter must be
the only reader: Prometheus scrapes the exporter, never the servers directly.

Where NVML finds an NVIDIA GPU, it also serves each GPU's utilisation, memory, power and energy
counter (`gpu`); elsewhere those series are absent.
"""

from __future__ import annotations

from quantload.exporter.collector import LlamaServerCollector
from quantload.exporter.serve import ExporterError, ExporterHandle, start_exporter
from quantload.exporter.targets import ExporterTarget, parse_target

__all__ = [
    "ExporterError",
    "ExporterHandle",
    "ExporterTarget",
    "LlamaServerCollector",
    "parse_target",
    "start_exporter",
]
