"""Faults of the network between hosts (docs/faults.md, "The network between hosts").

Four hosts in network namespaces (tests/netns_hosts.py): `server` (one llama-server of the tiny
model), `control` (`quantload load`), `monitor` (`quantload exporter` and Prometheus) and `relay`
(tests/netns_relay.py, the delay this kernel cannot add). The faults:

- a partition: the server's link taken down for a few seconds mid-stage, then up again;
- a slow link: a token-bucket filter (`tbf`) on what the server sends;
- added delay: the relay on the path, holding every byte for half a round trip each way.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

import netns_hosts
from netns_hosts import HostNetwork, host_network
from quantload.config import load_config
from quantload.llamacpp.server import ServerSpec
from quantload.llamacpp.toolchain import Toolchain
from support import clean_env, missing, require_binary

pytestmark = pytest.mark.integration
HOSTS = ("server", "control", "monitor", "relay")
QUANTLOAD = (sys.executable, "-m", "quantload.cli.main")
RELAY = Path(__file__).resolve().parents[1] / "netns_relay.py"
SERVER_PORT, RELAY_PORT, EXPORTER_PORT, PROMETHEUS_PORT, LOADGEN_PORT = 8083, 8083, 9646, 9090, 9647
NAME, QUANT = "llama-q4_k_m", "Q4_K_M"
PARTITION_S = 6.0
REQUEST_TIMEOUT_S = 4.0  # shorter than the partition, so requests caught in it time out
ADDED_RTT_S = 0.2
LOAD_TIMEOUT_S = 300.0


@dataclass
class Net:
    """The hosts, with the server, exporter and Prometheus running."""

    network: HostNetwork
    folder: Path
    env: dict[str, str]

    def address(self, host: str) -> str:
        return self.network[host].address

    @property
    def server_url(self) -> str:
        return self.network["server"].url(SERVER_PORT)

    def load_argv(self, out: Path, *args: str, urls: tuple[tuple[str, str, str], ...] = ()) -> list[str]:
        targets = urls or ((self.server_url, NAME, QUANT),)
        argv = [*QUANTLOAD, "load"]
        for url, name, quant in targets:
            argv += ["--url", url, "--name", name, "--quant", quant]
        return [
            *argv, "--model", "tiny", "-e", "sweep", "--workers", "0", "--metrics-host", self.address("control"),
            "--metrics-port", str(LOADGEN_PORT), "--out", str(out), *args,
        ]  # fmt: skip

    def load(self, out: Path, *args: str, urls: tuple[tuple[str, str, str], ...] = ()) -> list[dict[str, Any]]:
        result = self.network.run("control", self.load_argv(out, *args, urls=urls), LOAD_TIMEOUT_S, env=self.env)
        assert result.returncode == 0, result.stderr[-3000:]
        summaries: list[dict[str, Any]] = json.loads((out / "load-summary.json").read_text())
        return summaries

    def wait_until_up(self, timeout_s: float) -> None:
        """Until Prometheus holds `quantload_target_up 1` for the server."""
        url = f"{self.network['monitor'].url(PROMETHEUS_PORT)}/api/v1/query?query="
        expression = quote(f'quantload_target_up{{server="{NAME}"}} == 1')
        deadline = time.monotonic() + timeout_s
        while not json.loads(self.network.get("control", url + expression))["data"]["result"]:
            assert time.monotonic() < deadline, f"Prometheus never saw {NAME} up within {timeout_s:g} s"
            time.sleep(0.5)

    def query_range(self, expression: str, start: float, end: float) -> list[tuple[float, float]]:
        url = (
            f"{self.network['monitor'].url(PROMETHEUS_PORT)}/api/v1/query_range?query={quote(expression)}"
            f"&start={start:.3f}&end={end:.3f}&step=0.5"
        )
        result = json.loads(self.network.get("control", url))["data"]["result"]
        return [(float(t), float(v)) for t, v in result[0]["values"]] if result else []


@pytest.fixture(scope="module")
def net(toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    reason = netns_hosts.unavailable()
    if reason:
        missing(reason)
    prometheus = require_binary("prometheus", "apt-get install -y prometheus")
    folder = tmp_path_factory.mktemp("network-faults")
    env = {
        **clean_env(), "PYTHONUNBUFFERED": "1", "QUANTLOAD_RUN__PROFILE": "ci", "QUANTLOAD_LOAD__WARMUP_REQUESTS": "0",
    }  # fmt: skip
    settings = load_config(folder, {"QUANTLOAD_RUN__PROFILE": "ci"}).settings.server
    with host_network(HOSTS) as network:
        made = Net(network, folder, env)
        server, monitor = made.address("server"), made.address("monitor")
        # one thread: at llama.cpp's default of two, a busy core makes every step wait for the thread
        # that shares it, and the server's own prefill then swings by 100 ms and more between two
        # runs a minute apart (seen in CI beside a busy loop: 19.6 ms direct, 159 ms relayed)
        spec = ServerSpec(
            model_path=tiny_models[QUANT], alias=f"tiny-{QUANT}", slots=settings.slots,
            ctx_per_slot=settings.ctx_per_slot, host=server, threads=1,
        )  # fmt: skip
        network.spawn("server", spec.command(toolchain.path("llama-server"), SERVER_PORT), folder / "llama-server.log")
        config = folder / "prometheus-config"
        written = network.run("monitor", [
            *QUANTLOAD, "config", "prometheus", "--out", str(config), "--listen", f"{monitor}:{PROMETHEUS_PORT}",
            "--exporter", f"{monitor}:{EXPORTER_PORT}", "--loadgen", f"{made.address('control')}:{LOADGEN_PORT}",
        ], 60, env=env)  # fmt: skip
        assert written.returncode == 0, written.stderr
        network.spawn("monitor", [
            *QUANTLOAD, "exporter", "--host", monitor, "--port", str(EXPORTER_PORT),
            "--target", f"{NAME}={made.server_url},quant={QUANT},model=tiny",
        ], folder / "exporter.log", env=env)  # fmt: skip
        network.spawn("monitor", [
            prometheus, f"--config.file={config / 'prometheus.yml'}", f"--storage.tsdb.path={folder / 'tsdb'}",
            f"--web.listen-address={monitor}:{PROMETHEUS_PORT}",
        ], folder / "prometheus.log")  # fmt: skip
        for address, port in ((server, SERVER_PORT), (monitor, PROMETHEUS_PORT), (monitor, EXPORTER_PORT)):
            network.wait_listening("control", address, port, 120)
        made.wait_until_up(120)  # Prometheus has seen the server up before any fault is made
        yield made


def _records(out: Path) -> list[dict[str, Any]]:
    path = out / "records.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip().endswith("}")]


def test_a_partition_mid_stage_costs_timed_out_requests_and_the_load_goes_on(net: Net) -> None:
    out = net.folder / "partition"
    argv = net.load_argv(
        out, "--users", "2", "--repeats", "2", "--prompt-count", "60",
        "--request-timeout", f"{REQUEST_TIMEOUT_S:g}", "--first-byte-timeout", "3",
    )  # fmt: skip
    env = {**net.env, "QUANTLOAD_LOAD__MAX_CONSECUTIVE_ERRORS": "50"}
    started = time.time()
    load = net.network.spawn("control", argv, net.folder / "partition.log", env=env)
    deadline = time.monotonic() + LOAD_TIMEOUT_S
    while len([r for r in _records(out) if r["ok"]]) < 10:
        assert load.poll() is None and time.monotonic() < deadline, (net.folder / "partition.log").read_text()[-3000:]
        time.sleep(0.1)
    # and until Prometheus holds some of them (on a busy machine its scrape can lag the records), so
    # that what it had before the partition can be checked afterwards
    ok_total = f'sum(quantload_requests_total{{server="{NAME}",outcome="ok"}})'
    while not any(v > 0 for _, v in net.query_range(ok_total, started, time.time())):
        assert load.poll() is None and time.monotonic() < deadline, (net.folder / "partition.log").read_text()[-3000:]
        time.sleep(0.5)
    before = {(r["stage_id"], r["sent_unix_s"]) for r in _records(out)}
    down = time.time()
    net.network.link_down("server")
    time.sleep(PARTITION_S)
    net.network.link_up("server")
    up = time.time()
    code = load.wait(LOAD_TIMEOUT_S)
    ended = time.time()
    assert code == 0, (net.folder / "partition.log").read_text()[-3000:]
    records = _records(out)
    assert before <= {(r["stage_id"], r["sent_unix_s"]) for r in records}, "a record measured before it was lost"
    failed = [r for r in records if not r["ok"]]
    assert failed and {r["error_class"] for r in failed} <= {"timeout", "connect_error"}, failed[:3]
    caught = [r for r in failed if down - REQUEST_TIMEOUT_S - 1 <= r["sent_unix_s"] <= up + 1]
    assert caught, [(round(r["sent_unix_s"] - down, 2), r["error"]) for r in failed]
    after = [r for r in records if r["sent_unix_s"] > up + 1]
    assert after and sum(r["ok"] for r in after) >= 0.8 * len(after), "the load went on after the partition"
    summaries = json.loads((out / "load-summary.json").read_text())
    assert [s["status"] for s in summaries] == ["ok", "ok"]
    counted = {kind: n for s in summaries for kind, n in s["errors"].items()}
    assert sum(n for s in summaries for n in s["errors"].values()) == len(failed)
    assert set(counted) <= {"timeout", "connect_error"} and sum(s["requests_planned"] for s in summaries) == len(records)
    # the exporter said so: the server's `up` went to 0 for the partition and back to 1
    seen = net.query_range(f'quantload_target_up{{server="{NAME}"}}', started, ended + 5)
    assert any(v == 1 for t, v in seen if t < down), seen
    assert any(v == 0 for t, v in seen if down <= t <= up + 2), seen
    assert any(v == 1 for t, v in seen if t > up + 2), seen
    # and what Prometheus had of the load before the partition is still there
    kept = net.query_range(ok_total, started, down)
    assert kept and max(v for _, v in kept) > 0


def test_a_slow_link_stretches_time_per_token_while_the_server_keeps_its_pace(net: Net) -> None:
    args = ("--users", "1", "--repeats", "1", "--prompt-count", "4", "--max-tokens", "12", "--ignore-eos")
    (fast,) = net.load(net.folder / "unlimited", *args)
    # 4 kbit/s (500 B/s) for what the server sends: a streamed token's chunk of a few hundred bytes
    # takes about half a second on the wire, slower than the server's own pace even on a busy machine
    net.network.limit_rate("server", 4)
    try:
        (slow,) = net.load(net.folder / "limited", *args)
    finally:
        net.network.clear_limit("server")
    for summary in (fast, slow):  # a level sends at least its planned requests, more while undecided
        assert summary["status"] == "ok" and summary["ok"] == summary["requests_planned"] >= 4, summary
        assert not summary["errors"], summary
    server_pace_s = statistics.median(
        r["timings"]["predicted_per_token_ms"] / 1000 for r in _records(net.folder / "limited") if r["ok"]
    )
    assert slow["tpot_p50_s"] > fast["tpot_p50_s"], (fast["tpot_p50_s"], slow["tpot_p50_s"])
    # judged against the server's own pace in the same run, which a busy machine slows as well
    assert slow["tpot_p50_s"] > 2 * server_pace_s, (slow["tpot_p50_s"], server_pace_s)  # the wire, not the server


def test_added_delay_grows_the_network_part_of_ttft_and_not_the_prefill(net: Net) -> None:
    relay = net.network["relay"]
    net.network.spawn("relay", [
        sys.executable, str(RELAY), "--listen", f"{relay.address}:{RELAY_PORT}",
        "--to", f"{net.address('server')}:{SERVER_PORT}", "--rtt-ms", f"{ADDED_RTT_S * 1000:g}",
    ], net.folder / "relay.log")  # fmt: skip
    net.network.wait_listening("control", relay.address, RELAY_PORT, 30)
    out = net.folder / "delay"
    urls = ((net.server_url, "direct", QUANT), (relay.url(RELAY_PORT), "relayed", f"{QUANT}-relayed"))
    net.load(out, "--users", "1", "--repeats", "1", "--prompt-count", "8", "--max-tokens", "8", urls=urls)
    report = net.network.run("control", [*QUANTLOAD, "report", str(out)], LOAD_TIMEOUT_S, env=net.env)
    assert report.returncode == 0, report.stderr[-3000:]
    split = {row["quant"]: row for row in json.loads((out / "summary.json").read_text())["ttft_split"]}
    direct, relayed = split[QUANT], split[f"{QUANT}-relayed"]
    grew_s = relayed["queue_network_p50_s"] - direct["queue_network_p50_s"]
    assert 0.5 * ADDED_RTT_S < grew_s < 3 * ADDED_RTT_S, (direct, relayed)
    assert abs(relayed["prefill_p50_s"] - direct["prefill_p50_s"]) < ADDED_RTT_S / 2, (direct, relayed)
    assert "## Where TTFT goes: queueing+network and prefill" in (out / "report.md").read_text()
