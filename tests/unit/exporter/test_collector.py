"""The Collector against fake llama-servers, on a fresh registry per test."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from pathlib import Path
from unittest import mock

import pytest
from prometheus_client import CollectorRegistry

from fake_llama_server import FakeLlamaServer, metrics_text, slots_payload
from quantload.exporter.collector import LlamaServerCollector
from quantload.exporter.fetch import Fetched, Fetcher, TargetRequest
from quantload.exporter.targets import ExporterTarget

MakeFake = Callable[[], FakeLlamaServer]
MakeRegistry = Callable[..., tuple[CollectorRegistry, LlamaServerCollector]]
Q8 = {"server": "a", "quant": "Q8_0", "model": "tiny"}
ERRORS = "quantload_target_scrape_errors_total"


class Scrape:
    """One scrape of a registry (get_sample_value would read the servers again on every call)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.samples = {
            (s.name, frozenset(s.labels.items())): s.value
            for family in registry.collect()
            for s in family.samples
        }

    def __call__(self, name: str, labels: dict[str, str]) -> float | None:
        return self.samples.get((name, frozenset(labels.items())))


def _target(url: str, **kwargs: object) -> ExporterTarget:
    return ExporterTarget(name="a", url=url, quant="Q8_0", model="tiny", **kwargs)  # type: ignore[arg-type]


def test_server_metrics_are_renamed_and_labelled(fake_servers: MakeFake, registry_for: MakeRegistry) -> None:
    fake = fake_servers()
    fake.metrics_text = metrics_text(prompt_tokens=11, predicted=22, processing=2, deferred=3)
    registry, _ = registry_for([_target(fake.url)])
    value = Scrape(registry)
    assert value("llamacpp_prompt_tokens_total", Q8) == 11
    assert value("llamacpp_tokens_predicted_total", Q8) == 22
    assert value("llamacpp_requests_deferred", Q8) == 3
    assert value("llamacpp_predicted_tokens_per_second", Q8) == 95.25
    assert value("quantload_target_up", Q8) == 1
    assert value("quantload_exporter_scrape_duration_seconds", {}) is not None
    assert "/props" not in fake.reads  # labels were configured: no discovery


def test_the_model_size_is_read_once_from_v1_models(fake_servers: MakeFake, registry_for: MakeRegistry) -> None:
    sized, unsized = fake_servers(), fake_servers()
    sized.model_size_bytes = 38_547_392
    registry, _ = registry_for([_target(sized.url)])
    for _ in range(3):
        assert Scrape(registry)("quantload_target_model_bytes", Q8) == 38_547_392
    assert sized.reads["/v1/models"] == 1  # known after the first scrape
    other, _ = registry_for([_target(unsized.url)])
    for _ in range(2):
        assert Scrape(other)("quantload_target_model_bytes", Q8) is None  # a 404: no gauge, asked once
    assert unsized.reads["/v1/models"] == 1


def test_slot_usage_and_kv_ratio_from_slots(fake_servers: MakeFake, registry_for: MakeRegistry) -> None:
    fake = fake_servers()
    fake.slots = slots_payload(n_slots=8, busy=3, tokens=1000, n_ctx=4096)
    registry, _ = registry_for([_target(fake.url)])
    value = Scrape(registry)
    assert value("quantload_server_slots", Q8) == 8
    assert value("quantload_server_slots_busy", Q8) == 3
    assert value("quantload_server_slot_tokens", {**Q8, "slot": "0"}) == 1000
    assert value("quantload_server_slot_tokens", {**Q8, "slot": "3"}) == 500
    assert value("quantload_server_kv_tokens", {**Q8, "state": "busy"}) == 3000
    assert value("quantload_server_kv_tokens", {**Q8, "state": "idle"}) == 500
    assert value("quantload_server_kv_cells", Q8) == 8 * 4096
    assert value("quantload_server_kv_cells_used_ratio", Q8) == pytest.approx(3500 / (8 * 4096))
    assert value("quantload_target_info", {**Q8, "url": fake.url, "kv_cells_source": "slots"}) == 1


def test_kv_cells_from_configuration_and_from_log(
    fake_servers: MakeFake, registry_for: MakeRegistry, tmp_path: Path
) -> None:
    fake = fake_servers()
    fake.slots = slots_payload(n_slots=2, busy=1, tokens=256, n_ctx=512)
    log = tmp_path / "llama-server.log"
    log.write_text(
        "llama_kv_cache: size =    4.00 MiB (   512 cells,   2 layers,  2/2 seqs),"
        " K (f16):    2.00 MiB, V (f16):    2.00 MiB\n"
    )
    targets = [_target(fake.url, kv_cells=2048), ExporterTarget(name="b", url=fake.url, quant="F16", model="tiny", log_path=log)]
    registry, _ = registry_for(targets)
    value = Scrape(registry)
    b = {"server": "b", "quant": "F16", "model": "tiny"}
    assert value("quantload_server_kv_cells", Q8) == 2048
    assert value("quantload_server_kv_cells", b) == 1024
    assert value("quantload_server_kv_cells_used_ratio", b) == pytest.approx(384 / 1024)
    assert value("quantload_target_info", {**b, "url": fake.url, "kv_cells_source": "log"}) == 1


def test_labels_are_discovered_from_props_once(fake_servers: MakeFake, registry_for: MakeRegistry) -> None:
    fake = fake_servers()
    fake.props = {"model_path": "/m/tiny-Q4_K_M.gguf", "model_ftype": "Q4_K - Medium"}
    registry, collector = registry_for([ExporterTarget(name="a", url=fake.url)])
    labels = {"server": "a", "quant": "Q4_K_M", "model": "tiny"}
    assert Scrape(registry)("quantload_target_up", labels) == 1
    collector.collect()
    assert fake.reads["/props"] == 1


def test_api_key_is_sent(fake_servers: MakeFake, registry_for: MakeRegistry) -> None:
    fake = fake_servers()
    fake.api_key = "sekret"
    good, _ = registry_for([_target(fake.url, api_key="sekret")])
    bad, _ = registry_for([_target(fake.url, api_key="wrong")])
    assert Scrape(good)("quantload_target_up", Q8) == 1
    value = Scrape(bad)
    assert value("quantload_target_up", Q8) == 0
    assert value(ERRORS, {**Q8, "endpoint": "metrics", "error": "auth"}) == 1


def test_error_counters_start_at_zero(fake_servers: MakeFake, registry_for: MakeRegistry) -> None:
    registry, _ = registry_for([_target(fake_servers().url)])
    value = Scrape(registry)
    for error in ("timeout", "connect", "auth", "http_status", "protocol", "parse"):
        assert value(ERRORS, {**Q8, "endpoint": "slots", "error": error}) == 0


def test_slots_failure_keeps_metrics(fake_servers: MakeFake, registry_for: MakeRegistry) -> None:
    fake = fake_servers()
    fake.slots = {"not": "a list"}
    registry, _ = registry_for([_target(fake.url)])
    value = Scrape(registry)
    assert value("quantload_target_up", Q8) == 1
    assert value("llamacpp_requests_processing", Q8) == 2
    assert value("quantload_server_slots", Q8) is None
    assert value(ERRORS, {**Q8, "endpoint": "slots", "error": "parse"}) == 1


def _faulty_targets(make: MakeFake) -> list[ExporterTarget]:
    """good, slow (beyond the timeout), garbage, and down (nothing listens)."""
    fakes = {name: make() for name in ("good", "slow", "garbage")}
    fakes["slow"].delay_s = 2.0
    fakes["garbage"].mode = "garbage"
    down = make()
    down.stop()
    fakes["down"] = down
    return [ExporterTarget(name=name, url=fake.url, quant=name.upper(), model="m") for name, fake in fakes.items()]


def test_faults_are_contained_per_target(
    fake_servers: MakeFake, registry_for: MakeRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    timeout_s = 0.5
    registry, collector = registry_for(_faulty_targets(fake_servers), timeout_s)

    def labels(name: str, **more: str) -> dict[str, str]:
        return {"server": name, "quant": name.upper(), "model": "m", **more}

    durations = []
    with caplog.at_level(logging.INFO, logger="quantload.exporter.collector"):
        for _ in range(3):
            started = time.monotonic()
            value = Scrape(registry)
            durations.append(time.monotonic() - started)
    assert max(durations) < timeout_s + 0.5, durations
    assert value("quantload_target_up", labels("good")) == 1
    assert value("llamacpp_requests_processing", labels("good")) == 2
    assert value("quantload_server_slots", labels("good")) == 8
    for name in ("slow", "garbage", "down"):
        assert value("quantload_target_up", labels(name)) == 0, name
        assert value("quantload_server_slots", labels(name)) is None
    assert value(ERRORS, labels("slow", endpoint="metrics", error="timeout")) == 3
    assert value(ERRORS, labels("garbage", endpoint="metrics", error="parse")) == 3
    assert value(ERRORS, labels("garbage", endpoint="slots", error="parse")) == 3
    assert value(ERRORS, labels("down", endpoint="metrics", error="connect")) == 3
    assert value(ERRORS, labels("good", endpoint="metrics", error="timeout")) == 0
    # One line per target, endpoint and error class, however many scrapes; never a traceback.
    assert all(record.exc_info is None for record in caplog.records)
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == len(set(lines)) == 6, lines
    assert all("\n" not in line for line in lines)
    collector.collect()


def test_target_recovers(
    fake_servers: MakeFake, registry_for: MakeRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    fake = fake_servers()
    fake.mode = "http500"
    registry, _ = registry_for([_target(fake.url)])
    value = Scrape(registry)
    assert value("quantload_target_up", Q8) == 0
    assert value(ERRORS, {**Q8, "endpoint": "metrics", "error": "http_status"}) == 1
    fake.mode = "ok"
    with caplog.at_level(logging.INFO, logger="quantload.exporter.collector"):
        assert Scrape(registry)("quantload_target_up", Q8) == 1
    assert "a is up again" in caplog.text


def test_not_http_is_a_protocol_error(fake_servers: MakeFake, registry_for: MakeRegistry) -> None:
    fake = fake_servers()
    fake.mode = "not_http"
    registry, _ = registry_for([_target(fake.url)], 0.5)
    value = Scrape(registry)
    assert value("quantload_target_up", Q8) == 0
    assert value(ERRORS, {**Q8, "endpoint": "metrics", "error": "protocol"}) == 1


def test_a_trickling_answer_is_cut_at_the_deadline_and_not_restarted(
    fake_servers: MakeFake, registry_for: MakeRegistry
) -> None:
    fake = fake_servers()
    fake.mode = "trickle"
    registry, _ = registry_for([_target(fake.url)], 0.3)
    for _ in range(3):
        started = time.monotonic()
        value = Scrape(registry)
        assert time.monotonic() - started < 0.8
        assert value("quantload_target_up", Q8) == 0
        time.sleep(0.2)  # the abandoned read returns within one byte's wait
    assert value(ERRORS, {**Q8, "endpoint": "metrics", "error": "timeout"}) == 3
    # Each read is abandoned at the deadline, so every scrape starts a fresh one.
    assert fake.reads["/metrics"] == 3


def test_a_hung_target_is_not_read_again_while_its_read_runs() -> None:
    release = threading.Event()
    calls: list[str] = []

    def hang(*args: object) -> dict[str, Fetched]:
        calls.append("read")
        release.wait(5)
        return {}

    fetcher = Fetcher(0.1, 2)
    request = TargetRequest("a", "http://127.0.0.1:1", ["/metrics"])
    try:
        with mock.patch("quantload.exporter.fetch._read_target", hang):
            for _ in range(3):
                started = time.monotonic()
                result = fetcher.fetch_all([request])[("a", "/metrics")]
                assert result.error == "timeout"
                assert time.monotonic() - started < 0.5
        assert calls == ["read"]
    finally:
        release.set()
        fetcher.close()


def test_retargeting_swaps_the_servers_read(
    fake_servers: MakeFake, registry_for: MakeRegistry
) -> None:
    first, second, third = fake_servers(), fake_servers(), fake_servers()
    a = ExporterTarget(name="a", url=first.url, quant="Q8_0", model="tiny")
    registry, collector = registry_for([a])
    first.mode = "http500"
    assert Scrape(registry)("quantload_target_up", Q8) == 0
    first.mode = "ok"
    b = ExporterTarget(name="b", url=second.url, quant="Q4_K_M", model="tiny")
    collector.set_targets([b])
    value = Scrape(registry)
    q4 = {"server": "b", "quant": "Q4_K_M", "model": "tiny"}
    assert value("quantload_target_up", q4) == 1
    assert value("quantload_target_up", Q8) is None  # a is no longer read or shown
    reads_of_a = sum(first.reads.values())
    collector.set_targets([a, b, ExporterTarget(name="c", url=third.url, quant="F16", model="tiny")])  # grows the pool
    value = Scrape(registry)
    assert value("quantload_target_up", Q8) == 1 and value("quantload_target_up", q4) == 1
    assert value("quantload_target_up", {"server": "c", "quant": "F16", "model": "tiny"}) == 1
    assert sum(first.reads.values()) > reads_of_a
    collector.set_targets([])
    assert Scrape(registry)("quantload_target_up", q4) is None


def test_a_server_loading_its_model_is_down_and_counted_but_no_warning(
    fake_servers: MakeFake, registry_for: MakeRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    """A planned restart (kv_types, mixed) answers 503 "Loading model" for a while: the series say
    so, the console does not (INFO, not WARNING: a run that ends ok prints no exporter lines)."""
    fake = fake_servers()
    fake.mode = "loading"
    registry, _ = registry_for([_target(fake.url)])
    with caplog.at_level(logging.INFO, logger="quantload.exporter.collector"):
        value = Scrape(registry)
    assert value("quantload_target_up", Q8) == 0
    assert value(ERRORS, {**Q8, "endpoint": "metrics", "error": "http_status"}) == 1
    assert caplog.records and all(record.levelno == logging.INFO for record in caplog.records)
    assert any("loading its model" in record.getMessage() for record in caplog.records)
    fake.mode = "http500"
    with caplog.at_level(logging.INFO, logger="quantload.exporter.collector"):
        Scrape(registry)
    assert any(record.levelno == logging.WARNING for record in caplog.records)


def test_a_restart_quantload_planned_logs_no_error_but_is_still_counted(
    fake_servers: MakeFake, registry_for: MakeRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    """A server stopped and started again with other flags refuses connections meanwhile: while the
    run says so (`restarting`), no exporter error line reaches the console; after it, a refusal is
    a warning again."""
    fake = fake_servers()
    registry, collector = registry_for([_target(fake.url)])
    fake.stop()  # down: connections are refused
    with caplog.at_level(logging.INFO, logger="quantload.exporter.collector"), collector.restarting("a"):
        value = Scrape(registry)
    assert value("quantload_target_up", Q8) == 0
    assert value(ERRORS, {**Q8, "endpoint": "metrics", "error": "connect"}) == 1
    assert caplog.records and all(record.levelno == logging.INFO for record in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="quantload.exporter.collector"):
        Scrape(registry)
    assert any(record.levelno == logging.WARNING for record in caplog.records)
