"""Fixtures for the exporter's unit tests: fake llama-servers and collectors on fresh registries."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

import pytest
from prometheus_client import CollectorRegistry

from fake_llama_server import FakeLlamaServer
from quantload.exporter.collector import LlamaServerCollector
from quantload.exporter.targets import ExporterTarget


@pytest.fixture
def fake_servers() -> Iterator[Callable[[], FakeLlamaServer]]:
    """Start as many fake llama-servers as a test asks for; all stop afterwards."""
    started: list[FakeLlamaServer] = []

    def make() -> FakeLlamaServer:
        server = FakeLlamaServer().start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


@pytest.fixture
def registry_for() -> Iterator[Callable[..., tuple[CollectorRegistry, LlamaServerCollector]]]:
    """A fresh registry holding a collector over the given targets (closed afterwards)."""
    collectors: list[LlamaServerCollector] = []

    def make(
        targets: Sequence[ExporterTarget], timeout_s: float = 1.0, **kwargs: object
    ) -> tuple[CollectorRegistry, LlamaServerCollector]:
        collector = LlamaServerCollector(targets, timeout_s, **kwargs)  # type: ignore[arg-type]
        collectors.append(collector)
        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        return registry, collector

    yield make
    for collector in collectors:
        collector.close()
