"""Serving the exporter over HTTP from a background thread, on a registry of its own."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

from quantload.errors import QuantloadError
from quantload.exporter.collector import LlamaServerCollector
from quantload.exporter.gpu import GpuCollector, open_gpu_telemetry
from quantload.exporter.targets import ExporterTarget
from quantload.nvml import NvmlLoader, system_nvml


class ExporterError(QuantloadError):
    """The exporter could not start."""


@dataclass
class ExporterHandle:
    """A running exporter: where Prometheus finds it, and how to stop it."""

    host: str
    port: int
    registry: CollectorRegistry
    collector: LlamaServerCollector
    gpu: GpuCollector | None  # None: no NVML or no GPU here, so no quantload_gpu_* series
    _server: WSGIServer
    _thread: threading.Thread

    @property
    def url(self) -> str:
        """Base URL; metrics are under `/metrics`."""
        return f"http://{self.host}:{self.port}"

    @property
    def address(self) -> str:
        """`host:port`, as a Prometheus scrape target."""
        return f"{self.host}:{self.port}"

    def set_targets(self, targets: Sequence[ExporterTarget]) -> None:
        """Change the servers read from the next scrape on (see LlamaServerCollector.set_targets)."""
        self.collector.set_targets(targets)

    def restarting(self, name: str) -> contextlib.AbstractContextManager[None]:
        """While quantload restarts the target `name` on purpose, its scrapes log no errors."""
        return self.collector.restarting(name)

    def stop(self) -> None:
        """Stop serving and release the collector's connections."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
        self.collector.close()
        if self.gpu is not None:
            self.gpu.close()


def start_exporter(
    targets: Sequence[ExporterTarget],
    port: int = 9646,
    timeout_s: float = 0.5,
    host: str = "127.0.0.1",
    nvml: NvmlLoader | None = system_nvml,
) -> ExporterHandle:
    """Serve the metrics of `targets` at http://host:port/metrics (port 0 picks a free one).

    With `nvml` (the system's NVML by default; None turns it off), every GPU NVML sees adds its
    `quantload_gpu_*` series, read within half of `timeout_s` after the servers' reads, so that a
    hung NVML and hung servers together keep a scrape within 1.5 x `timeout_s` (under Prometheus's
    1 s scrape timeout at the default 0.5 s).
    """
    gpu = open_gpu_telemetry(nvml, timeout_s / 2) if nvml is not None else None
    collector = LlamaServerCollector(targets, timeout_s, gpus=gpu.gpus if gpu is not None else ())
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    if gpu is not None:
        registry.register(gpu)
    try:
        server, thread = start_http_server(port, addr=host, registry=registry)
    except OSError as error:
        collector.close()
        if gpu is not None:
            gpu.close()
        raise ExporterError(
            f"exporter cannot listen on {host}:{port}: {error.strerror or error}",
            "choose another port with --port (0 = any free port)",
        ) from None
    bound_port = int(server.server_address[1])
    return ExporterHandle(host, bound_port, registry, collector, gpu, server, thread)
