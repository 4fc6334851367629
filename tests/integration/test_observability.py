"""The observability stack for real: llama-servers (tiny model, two quants) under streaming load,
the exporter reading them, Prometheus (Debian binary) scraping the exporter and the load
generator's metrics; then every query of every Grafana panel, annotation and variable is run
against that Prometheus and must return data, and so must every recording rule.

Traffic comes from one fixture, `load_driver`. Today it is a stand-in (a streaming httpx loop per
user, counting with the load generator's own `LoadMetrics` collector and serving it like a Locust
process would); to use the real load generator, replace that fixture only.
"""

from __future__ import annotations

import copy
import itertools
import json
import os
import shutil
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol
from wsgiref.simple_server import WSGIServer

import httpx
import pytest
import yaml
from prometheus_client import start_http_server

from quantload.exporter import Target, start_exporter
from quantload.exporter.labels import model_from_filename
from quantload.llamacpp.server import LlamaServer, ServerSpec
from quantload.llamacpp.toolchain import Toolchain
from quantload.load.metrics import LoadMetrics, new_registry
from quantload.observe.annotations import read_stage_spans
from quantload.observe.dashboard import QueryCheck, check_dashboard, load_dashboard
from quantload.observe.promql import PrometheusClient
from quantload.stack.prometheus import CONFIG_DIR, PrometheusProcess

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
OVERVIEW = REPO / "grafana" / "dashboards" / "quantload-overview.json"
QUANTS = ("Q8_0", "Q4_K_M")
SLOTS = 4
CTX_PER_SLOT = 512
STAGE_USERS = (1, 2)
STAGE_S = 8.0
SCRAPE_S = 1.0


def require_binary(name: str) -> None:
    """Skip when `name` is not installed, or fail when CI demands every integration test."""
    if shutil.which(name) is None:
        reason = f"{name} is not installed (apt-get install prometheus)"
        if os.environ.get("QUANTLOAD_REQUIRE_INTEGRATION") == "1":
            pytest.fail(reason)
        pytest.skip(reason)


@dataclass(frozen=True)
class LoadTarget:
    """A server to drive: the labels the load generator puts on its metrics, and where it is."""

    name: str
    quant: str
    model: str
    url: str


class LoadDriver(Protocol):
    """What the test needs from a load generator."""

    def metrics_addresses(self, targets: Sequence[LoadTarget]) -> list[str]:
        """host:port of every process that will serve quantload_* metrics (before Prometheus)."""
        ...

    def run(self, targets: Sequence[LoadTarget], users: Sequence[int], stage_s: float) -> None:
        """Drive every target at once through one stage per entry of `users`; block until done."""
        ...


class StandInLoad:
    """Streaming chat requests from one thread per user; per target one LoadMetrics collector,
    served on its own port (like one Locust process per target), and stages.jsonl lines."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._metrics: dict[str, LoadMetrics] = {}
        self._servers: list[WSGIServer] = []
        self._stages_lock = threading.Lock()

    def metrics_addresses(self, targets: Sequence[LoadTarget]) -> list[str]:
        addresses = []
        for target in targets:
            metrics = LoadMetrics()
            server, _ = start_http_server(0, addr="127.0.0.1", registry=new_registry(metrics))
            self._metrics[target.name] = metrics
            self._servers.append(server)
            addresses.append(f"127.0.0.1:{server.server_address[1]}")
        return addresses

    def run(self, targets: Sequence[LoadTarget], users: Sequence[int], stage_s: float) -> None:
        threads = [threading.Thread(target=self._drive, args=(target, users, stage_s)) for target in targets]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=stage_s * len(users) + 60)

    def close(self) -> None:
        for server in self._servers:
            server.shutdown()
            server.server_close()

    def _stage_event(self, kind: str, target: LoadTarget, users: int, index: int) -> None:
        event = {
            "event": kind,
            "unix_s": time.time(),
            "server": target.name,
            "quant": target.quant,
            "experiment": "sweep",
            "stage_users": users,
            "repeat": 0,
            "stage_id": f"{target.name}-{index}",
        }
        with self._stages_lock, (self.run_dir / "stages.jsonl").open("a") as stages:
            stages.write(json.dumps(event) + "\n")

    def _drive(self, target: LoadTarget, users: Sequence[int], stage_s: float) -> None:
        metrics = self._metrics[target.name]
        for index, count in enumerate(users):
            metrics.set_stage((target.name, target.quant, "sweep", str(count), "0", ""))
            metrics.set_active_users(target.name, target.quant, count)
            self._stage_event("stage_start", target, count, index)
            stop_at = time.monotonic() + stage_s
            workers = [
                threading.Thread(target=self._user, args=(target, metrics, stop_at, n)) for n in range(count)
            ]
            for worker in workers:
                worker.start()
            for worker in workers:
                worker.join()
            self._stage_event("stage_end", target, count, index)
        metrics.set_stage(None)
        metrics.set_active_users(target.name, target.quant, 0)

    def _user(self, target: LoadTarget, metrics: LoadMetrics, stop_at: float, user: int) -> None:
        number = 0
        while time.monotonic() < stop_at:
            number += 1
            prompt = f"User {user} asks question {number}: count slowly from {number} upward."
            _one_request(target, metrics, prompt)


def _one_request(target: LoadTarget, metrics: LoadMetrics, prompt: str) -> None:
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 16,
        "ignore_eos": True,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    labels = (target.name, target.quant, "sweep")
    sent = time.monotonic()
    content_times: list[float] = []
    usage: dict[str, int] = {}
    try:
        # llama-server closes the connection after a stream: a fresh one per request.
        with (
            httpx.Client(timeout=30, headers={"Connection": "close"}) as client,
            client.stream("POST", f"{target.url}/v1/chat/completions", json=body) as response,
        ):
            response.raise_for_status()
            for line in response.iter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                    content_times.append(time.monotonic())
                usage = chunk.get("usage") or usage
    except (httpx.HTTPError, ValueError) as error:
        metrics.observe_request(labels, type(error).__name__, None, None, None, [], 0.0, None, None)
        return
    end = time.monotonic()
    tokens = usage.get("completion_tokens", len(content_times))
    ttft = content_times[0] - sent if content_times else None
    tpot = (end - sent - ttft) / (tokens - 1) if ttft is not None and tokens > 1 else None
    gaps = [b - a for a, b in itertools.pairwise(content_times)]
    metrics.observe_request(
        labels, "ok", ttft, tpot, end - sent, gaps, 0.0, usage.get("prompt_tokens"), tokens
    )


@pytest.fixture
def load_driver(tmp_path: Path) -> Iterator[LoadDriver]:
    """The one place that decides what drives the traffic (see the module docstring)."""
    driver = StandInLoad(tmp_path)
    yield driver
    driver.close()


@pytest.fixture
def servers(
    toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path
) -> Iterator[dict[str, LlamaServer]]:
    started: dict[str, LlamaServer] = {}
    try:
        for quant in QUANTS:
            spec = ServerSpec(
                tiny_models[quant], alias=f"tiny-{quant}", slots=SLOTS, ctx_per_slot=CTX_PER_SLOT
            )
            log = tmp_path / "logs" / f"llama-server-{quant}.log"
            started[quant] = LlamaServer(toolchain, spec, log, startup_timeout_s=120).start()
        yield started
    finally:
        for server in started.values():
            server.stop()


def assert_all_have_data(checks: Sequence[QueryCheck]) -> None:
    """Fail naming every query that errored or returned no number."""
    failed = [check.describe() for check in checks if not check.ok]
    assert not failed, "queries without data:\n" + "\n".join(failed)


def test_every_dashboard_query_has_data_from_a_real_run(
    servers: dict[str, LlamaServer],
    tiny_models: dict[str, Path],
    load_driver: LoadDriver,
    tmp_path: Path,
) -> None:
    require_binary("prometheus")
    q8, q4 = servers["Q8_0"], servers["Q4_K_M"]
    exporter_targets = [
        # Labels and KV cells given, the way native mode knows them...
        Target("llama-q8", q8.url, quant="Q8_0", model="tiny", log_path=q8.log_path),
        # ...and learnt from /props and /slots, the way a bare `--target NAME=URL` works.
        Target("llama-q4", q4.url),
    ]
    load_targets = [
        LoadTarget("llama-q8", "Q8_0", "tiny", q8.url),
        LoadTarget("llama-q4", "Q4_K_M", "tiny", q4.url),
    ]
    exporter = start_exporter(exporter_targets, port=0, timeout_s=0.5)
    try:
        loadgen = load_driver.metrics_addresses(load_targets)
        with PrometheusProcess(tmp_path, exporter.url, loadgen, SCRAPE_S) as prometheus:
            assert prometheus.wait_scraping()
            config = (tmp_path / "prometheus" / "prometheus.yml").read_text()
            assert q8.url.split("//")[1] not in config  # Prometheus never reads a server
            started = time.time()
            load_driver.run(load_targets, STAGE_USERS, STAGE_S)
            time.sleep(3 * SCRAPE_S)  # the last scrapes and rule evaluations
            end = time.time()
            with PrometheusClient(prometheus.url) as client:
                _check_dashboards(client, started, end)
                _check_recording_rules(client, started, end)
                _check_server_view(client, started, end, tiny_models["Q4_K_M"])
                _check_a_server_going_down(client, q4)
    finally:
        exporter.stop()
    spans = read_stage_spans(tmp_path / "stages.jsonl")
    assert len(spans) == len(STAGE_USERS) * len(load_targets)


def _check_dashboards(client: PrometheusClient, start: float, end: float) -> None:
    dashboard = load_dashboard(OVERVIEW)
    everything = check_dashboard(client, dashboard, start, end, SCRAPE_S)
    assert {check.query.kind for check in everything} == {"panel", "annotation", "variable"}
    assert_all_have_data(everything)
    one_quant = check_dashboard(
        client, dashboard, start, end, SCRAPE_S, {"quant": ["Q8_0"], "server": ["llama-q8"]}
    )
    assert_all_have_data(one_quant)

    # The mechanism itself: a panel with a broken query, and one naming a metric nobody serves.
    broken = copy.deepcopy(dashboard)
    bad_panel = copy.deepcopy(broken["panels"][0])
    bad_panel.update(id=998, title="broken")
    bad_panel["targets"] = [{**bad_panel["targets"][0], "expr": "sum by (quant (rate(x[5m]))"}]
    typo_panel = copy.deepcopy(bad_panel)
    typo_panel.update(id=999, title="typo")
    typo_panel["targets"] = [{**typo_panel["targets"][0], "expr": "quantload_ttft_secnds_bucket"}]
    broken["panels"] += [bad_panel, typo_panel]
    checks = check_dashboard(client, broken, start, end, SCRAPE_S)
    assert sorted(c.query.where for c in checks if not c.ok) == [
        "panel 998 'broken' A",
        "panel 999 'typo' A",
    ]
    with pytest.raises(AssertionError, match="broken"):
        assert_all_have_data(checks)


def _check_recording_rules(client: PrometheusClient, start: float, end: float) -> None:
    rules = yaml.safe_load((CONFIG_DIR / "rules" / "quantload.rules.yml").read_text())
    records = [rule["record"] for group in rules["groups"] for rule in group["rules"]]
    empty = [r for r in records if not any(s.has_number() for s in client.query_range(r, start, end, 1))]
    assert not empty, f"recording rules without data: {empty}"
    quants = {s.labels["quant"] for s in client.query_range(records[0], start, end, 1)}
    assert quants == set(QUANTS)


def _check_server_view(client: PrometheusClient, start: float, end: float, q4_file: Path) -> None:
    window = f"[{round(end - start)}s]"

    def at_end(expr: str) -> dict[str, float]:
        return {s.labels.get("server", ""): s.values()[-1] for s in client.query(expr, at=end)}

    q4_labels = client.query('quantload_target_info{server="llama-q4"}', at=end)[0].labels
    assert q4_labels["quant"] == "Q4_K_M" and q4_labels["model"] == model_from_filename(q4_file.name)
    info = {
        s.labels["server"]: s.labels["kv_cells_source"] for s in client.query("quantload_target_info", at=end)
    }
    assert info == {"llama-q8": "log", "llama-q4": "slots"}
    # Non-unified cache: the log's cells x streams equals the sum of the slots' n_ctx.
    assert at_end("quantload_server_kv_cells") == {
        "llama-q8": SLOTS * CTX_PER_SLOT,
        "llama-q4": SLOTS * CTX_PER_SLOT,
    }
    kv_peak = at_end(f"max_over_time(quantload_server_kv_cells_used_ratio{window})")
    assert all(0 < value <= 1 for value in kv_peak.values()), kv_peak
    busy_peak = at_end(f"max_over_time(quantload_server_slots_busy{window})")
    assert all(value >= 1 for value in busy_peak.values()), busy_peak
    predicted = at_end(f"increase(llamacpp_tokens_predicted_total{window})")
    assert all(value > 0 for value in predicted.values()), predicted
    assert set(at_end("quantload_target_up").values()) == {1.0}


def _check_a_server_going_down(client: PrometheusClient, q4: LlamaServer) -> None:
    q4.stop()
    deadline = time.time() + 10
    while time.time() < deadline:
        up = {s.labels["server"]: s.values()[-1] for s in client.query("quantload_target_up")}
        if up.get("llama-q4") == 0:
            break
        time.sleep(0.5)
    assert up == {"llama-q8": 1.0, "llama-q4": 0.0}
    assert client.query('up{job="exporter"}')[0].values()[-1] == 1.0
