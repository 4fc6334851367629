"""The whole protocol on five hosts in network namespaces, by the commands a multi-host user runs.

tests/hosts_protocol.py runs it (a server host with a llama-server per quantization, two load hosts
with `quantload load-worker`, a control host with `quantload load --remote-workers 2` and the
report, a monitoring host with the exporter and Prometheus) on the tiny model with the ci profile's
settings and every experiment `quantload load` can run against servers it did not start. The
report must be the native run's: every section it measured, Prometheus holding series from every
host. tests/netns_hosts.py removes the hosts whatever happens and fails the run if anything of
them is left behind.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import netns_hosts
from hosts_protocol import HOSTS, LOAD_HOSTS, LOADGEN_PORT, QUANTS, Protocol, ProtocolRun
from netns_hosts import host_network
from quantload.llamacpp.toolchain import Toolchain
from support import clean_env, missing, require_binary

# long: a whole run over five namespace hosts: `make test-long` runs it
pytestmark = [pytest.mark.integration, pytest.mark.long]
# every experiment `quantload load` runs against servers it did not start (kv_types starts its own)
EXPERIMENTS = ("sweep", "prefix_cache", "sessions", "mixed", "limit_users")


@dataclass
class MultiHost:
    """The finished run, and what the monitoring host's Prometheus held while the hosts were up."""

    protocol: Protocol
    run: ProtocolRun
    up: dict[tuple[str, str], float]  # (job, instance) -> highest `up` seen during the run
    request_series_by_instance: dict[str, int]
    stage_info_instances: set[str]
    exporter_servers: set[str]


def _series(protocol: Protocol, expression: str) -> list[dict[str, Any]]:
    return protocol.query(expression)


@pytest.fixture(scope="module")
def multi_host(
    toolchain: Toolchain, tiny_models: dict[str, Path], wikitext_test_raw: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[MultiHost]:  # fmt: skip
    reason = netns_hosts.unavailable()
    if reason:
        missing(reason)
    require_binary("prometheus", "apt-get install -y prometheus")
    run_dir = tmp_path_factory.mktemp("multi-host") / "netns-ci"
    manifest = tiny_models["F16"].parent / "manifest.json"
    with host_network(HOSTS) as network:
        protocol = Protocol(
            network, toolchain, manifest, run_dir, "ci", EXPERIMENTS, wikitext_test_raw, clean_env()
        )
        started = time.time()
        run = protocol.run()
        span = f"[{int(time.time() - started) + 60}s]"
        up = {
            (s["metric"]["job"], s["metric"]["instance"]): float(s["value"][1])
            for s in _series(protocol, f"max by (job, instance) (max_over_time(up{span}))")
        }
        requests = {
            s["metric"]["instance"]: int(float(s["value"][1]))
            for s in _series(protocol, f"count by (instance) (count_over_time(quantload_ttft_seconds_count{span}))")
        }
        stage_info = {
            s["metric"]["instance"] for s in _series(protocol, f"max by (instance) (max_over_time(quantload_stage_info{span}))")
        }
        servers = {
            s["metric"]["server"]
            for s in _series(protocol, f"max by (server) (max_over_time(quantload_target_up{span}))")
            if float(s["value"][1]) == 1
        }
        yield MultiHost(protocol, run, up, requests, stage_info, servers)
    # host_network has removed every host by now and asserted that nothing of them is left


def _records(run_dir: Path) -> list[dict[str, Any]]:
    lines = (run_dir / "records.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def test_the_load_goes_across_hosts_with_no_loopback_address(multi_host: MultiHost) -> None:
    protocol, run_dir = multi_host.protocol, multi_host.run.run_dir
    server = protocol.address("server")
    records = _records(run_dir)
    assert records and {r["url"].split("/")[2].split(":")[0] for r in records} == {server}
    assert {r["quant"] for r in records} == set(QUANTS)
    plans = [json.loads(p.read_text()) for p in (run_dir / "load-plans").glob("*.json")]
    assert plans and all("127.0.0.1" not in plan["target"]["url"] for plan in plans)
    ends = [
        e for e in map(json.loads, (run_dir / "stages.jsonl").read_text().splitlines()) if e["event"] == "stage_end"
    ]  # fmt: skip
    assert {e["workers"] for e in ends} == {len(LOAD_HOSTS)}  # every stage ran on both load hosts
    assert all(e["status"] == "ok" for e in ends if e["experiment"] != "limit_users"), [
        (e["stage_id"], e["reason"]) for e in ends if e["status"] != "ok"
    ]
    masters = sorted((run_dir / "logs").glob("locust-*-master.log"))
    assert masters and not list((run_dir / "logs").glob("locust-*-worker*.log"))  # no worker of its own
    for host in LOAD_HOSTS:  # each load host joined every plan in turn
        said = (run_dir / "logs" / f"load-worker-{host}.console").read_text()
        assert said.count("ended its plan") == len(masters), said[-2000:]


def test_the_report_has_every_section_of_a_native_run(multi_host: MultiHost, ci_run: Path) -> None:
    summary = multi_host.run.summary()
    native = json.loads((ci_run / "summary.json").read_text())
    # what was not measured is what the native run did not measure either (no GPU here), never a
    # part the hosts lost
    assert {(gap["section"], gap["what"]) for gap in summary["not_measured"]} == {
        (gap["section"], gap["what"]) for gap in native["not_measured"]
    }
    assert {gap["section"] for gap in native["not_measured"]} <= {"gpu", "contexts", "tenants"}
    assert summary["quants"] == native["quants"] == list(QUANTS)
    for section, value in native.items():
        if isinstance(value, list | dict) and value:
            assert summary[section], f"{section} is empty across hosts but not in the native run"
    assert {(row["quant"], row["users"]) for row in summary["sweep_levels"]} == {
        (row["quant"], row["users"]) for row in native["sweep_levels"]
    }
    for row in summary["table"]:
        for key in ("perplexity", "prefill_tok_s", "decode_tok_s", "ttft_p50_s_at_1_users", "kld_mean_nats"):
            assert isinstance(row[key], float), (row["quant"], key)
    assert all(entry["diff_pct"] == 0.0 for entry in summary["kv"])
    assert all(entry["on"]["cache_n_mean"] > entry["off"]["cache_n_mean"] == 0 for entry in summary["prompt_cache"])
    assert [line["quant"] for line in summary["limits"]] == list(QUANTS)
    headings = [line for line in (multi_host.run.run_dir / "report.md").read_text().splitlines() if line.startswith("## ")]
    assert headings == [line for line in (ci_run / "report.md").read_text().splitlines() if line.startswith("## ")]
    # what differs, and why: the mixed experiment at the servers' own batch size only (quantload load
    # does not restart servers it did not start), and no kv_types decode stages (they need servers
    # quantload starts itself)
    assert {row["server_args"] for row in summary["mixed"]} == {"server's own batch size"}
    assert all(row["output_tok_s"] is None for row in summary["kv_cache_types"])


def test_prometheus_holds_series_from_every_host(multi_host: MultiHost) -> None:
    protocol = multi_host.protocol
    address = protocol.address
    loadgen = {f"{address(host)}:{LOADGEN_PORT}" for host in ("control", *LOAD_HOSTS)}
    scraped = {instance for (job, instance), value in multi_host.up.items() if job == "loadgen" and value == 1}
    assert scraped == loadgen, multi_host.up
    assert multi_host.up[("exporter", f"{address('monitor')}:9646")] == 1
    # requests are timed where they are sent: on the two load hosts; the master says which stage runs
    senders = {instance for instance, count in multi_host.request_series_by_instance.items() if count}
    assert senders == {f"{address(host)}:{LOADGEN_PORT}" for host in LOAD_HOSTS}
    assert multi_host.stage_info_instances == {f"{address('control')}:{LOADGEN_PORT}"}
    assert multi_host.exporter_servers == {"llama-f16", "llama-q8_0", "llama-q4_k_m"}
    prometheus = multi_host.run.summary()["prometheus"]
    assert prometheus["origin"].endswith(f"({protocol.prometheus_url})")
    assert prometheus["series_points"] > 0 and prometheus["histogram_check"]
    assert any(row["prom_requests"] > 0 for row in prometheus["histogram_check"])
