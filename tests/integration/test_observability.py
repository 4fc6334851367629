"""The observability stack for real: llama-servers (tiny model, two quants) under streaming load,
the exporter reading them, Prometheus (Debian binary) scraping the exporter and the load
generator's metrics; then every query of every Grafana panel, annotation and variable is run
against that Prometheus and must return data, and so must every recording rule.

Traffic comes from one fixture, `load_driver`: the real load generator (the registry's sweep experiment,
Locust processes streaming chat completions), driving both servers at once.
"""

from __future__ import annotations

import copy
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pytest
import yaml

from dashboard_check import QueryCheck, check_dashboard, load_dashboard
from load_api import experiment
from quantload.config import LoadSettings
from quantload.exporter import ExporterTarget, start_exporter
from quantload.exporter.labels import model_from_filename
from quantload.llamacpp.server import LlamaServer, ServerSpec, free_port
from quantload.llamacpp.toolchain import Toolchain
from quantload.observe.annotations import read_stage_spans
from quantload.observe.prometheus import PrometheusProcess, prometheus_config_dir
from quantload.observe.promql import PrometheusClient
from quantload.served import ServedTarget
from support import require_binary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

REPO = Path(__file__).resolve().parents[2]
OVERVIEW = REPO / "grafana" / "dashboards" / "quantload-overview.json"
QUANTS = ("Q8_0", "Q4_K_M")
SLOTS = 4
CTX_PER_SLOT = 512
STAGE_USERS = (1, 2)
STAGE_S = 8.0
PROMPTS_PER_STAGE = 6
SCRAPE_S = 1.0


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


class LocustLoad:
    """The real load generator: one sweep per target, all targets at once, each invocation's
    Locust process serving its metrics on a port chosen before Prometheus starts."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._ports: dict[str, int] = {}

    def metrics_addresses(self, targets: Sequence[LoadTarget]) -> list[str]:
        self._ports = {target.name: free_port() for target in targets}
        return [f"127.0.0.1:{self._ports[target.name]}" for target in targets]

    def run(self, targets: Sequence[LoadTarget], users: Sequence[int], stage_s: float) -> None:
        errors: list[BaseException] = []

        def drive(target: LoadTarget) -> None:
            settings = LoadSettings(
                users=tuple(users), repeats=1, prompt_count=PROMPTS_PER_STAGE, max_prompt_tokens=200,
                max_tokens=16, ignore_eos=True, warmup_requests=1, first_round_jitter_s=0.02,
                stage_timeout_s=stage_s * 10, metrics_port=self._ports[target.name],
            )  # fmt: skip
            try:
                summaries = experiment(
                    "sweep",
                    ServedTarget(name=target.name, quant=target.quant, model=target.model, url=target.url),
                    settings, self.run_dir, "obs",
                )
                assert all(summary.status == "ok" for summary in summaries), summaries
            except BaseException as error:
                errors.append(error)

        threads = [threading.Thread(target=drive, args=(target,)) for target in targets]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=stage_s * 10 * len(users) + 120)
        assert not errors, errors

    def close(self) -> None:
        return


@pytest.fixture
def load_driver(tmp_path: Path) -> Iterator[LoadDriver]:
    """The one place that decides what drives the traffic (see the module docstring)."""
    driver = LocustLoad(tmp_path)
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
    require_binary("prometheus", "apt-get install prometheus")
    q8, q4 = servers["Q8_0"], servers["Q4_K_M"]
    exporter_targets = [
        # Labels and KV cells given, the way native mode knows them...
        ExporterTarget(name="llama-q8", url=q8.url, quant="Q8_0", model="tiny", log_path=q8.log_path),
        # ...and learnt from /props and /slots, the way a bare `--target NAME=URL` works.
        ExporterTarget(name="llama-q4", url=q4.url),
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
                _check_dashboards(client, started, end, has_gpu=exporter.gpu is not None)
                _check_recording_rules(client, started, end)
                _check_server_view(client, started, end, tiny_models["Q4_K_M"])
                _check_a_server_going_down(client, q4)
    finally:
        exporter.stop()
    spans = read_stage_spans(tmp_path / "stages.jsonl")
    assert len(spans) == len(STAGE_USERS) * len(load_targets)


def assert_gpu_queries_honest(checks: Sequence[QueryCheck], has_gpu: bool) -> None:
    """The GPU panels' queries: data where the exporter has a GPU, else run cleanly and find none."""
    gpu = [check for check in checks if check.query.needs_gpu]
    assert gpu, "the dashboard has no GPU panel"
    if has_gpu:
        assert_all_have_data(gpu)
    else:
        wrong = [check.describe() for check in gpu if not check.ok_without_gpu()]
        assert not wrong, "GPU queries on a machine without a GPU:\n" + "\n".join(wrong)


def _check_dashboards(client: PrometheusClient, start: float, end: float, has_gpu: bool) -> None:
    dashboard = load_dashboard(OVERVIEW)
    everything = check_dashboard(client, dashboard, start, end, SCRAPE_S)
    assert {check.query.kind for check in everything} == {"panel", "annotation", "variable"}
    assert_all_have_data([check for check in everything if not check.query.needs_gpu])
    assert_gpu_queries_honest(everything, has_gpu)
    one_quant = check_dashboard(
        client, dashboard, start, end, SCRAPE_S, {"quant": ["Q8_0"], "server": ["llama-q8"]}
    )
    assert_all_have_data([check for check in one_quant if not check.query.needs_gpu])
    assert_gpu_queries_honest(one_quant, has_gpu)

    # The mechanism itself: a panel with a broken query, and one naming a metric nobody serves.
    broken = copy.deepcopy(dashboard)
    bad_panel = copy.deepcopy(broken["panels"][0])
    bad_panel.update(id=998, title="broken")
    bad_panel["targets"] = [{**bad_panel["targets"][0], "expr": "sum by (quant (rate(x[5m]))"}]
    typo_panel = copy.deepcopy(bad_panel)
    typo_panel.update(id=999, title="typo")
    typo_panel["targets"] = [{**typo_panel["targets"][0], "expr": "quantload_ttft_secnds_bucket"}]
    broken["panels"] += [bad_panel, typo_panel]
    checks = [c for c in check_dashboard(client, broken, start, end, SCRAPE_S) if not c.query.needs_gpu]
    assert sorted(c.query.where for c in checks if not c.ok) == [
        "panel 998 'broken' A",
        "panel 999 'typo' A",
    ]
    with pytest.raises(AssertionError, match="broken"):
        assert_all_have_data(checks)


def _check_recording_rules(client: PrometheusClient, start: float, end: float) -> None:
    rules = yaml.safe_load((prometheus_config_dir() / "rules" / "quantload.rules.yml").read_text())
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
