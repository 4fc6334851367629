"""The exporter served over HTTP on loopback."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from fake_llama_server import FakeLlamaServer
from quantload.exporter import ExporterError, ExporterTarget, start_exporter


def test_serves_metrics_and_ignores_target_parameters(
    fake_servers: Callable[[], FakeLlamaServer],
) -> None:
    fake, other = fake_servers(), fake_servers()
    handle = start_exporter([ExporterTarget(name="a", url=fake.url, quant="Q8_0", model="tiny")], port=0, timeout_s=0.5)
    try:
        assert handle.url.startswith("http://127.0.0.1:") and handle.port > 0
        body = httpx.get(f"{handle.url}/metrics?target={other.url}", timeout=5).text
        assert 'quantload_target_up{model="tiny",quant="Q8_0",server="a"} 1.0' in body
        assert "llamacpp_tokens_predicted_total" in body
        assert "/metrics" not in other.reads  # no caller can point the exporter elsewhere
    finally:
        handle.stop()
    assert fake.reads["/metrics"] == 1


def test_busy_port_is_an_exporter_error() -> None:
    handle = start_exporter([], port=0)
    try:
        with pytest.raises(ExporterError, match="cannot listen"):
            start_exporter([], port=handle.port)
    finally:
        handle.stop()
