"""The compose stack's Locust master and workers, as separate processes on loopback.

The command lines come from docker-compose.yml (services locust-master and locust-worker), with
only the addresses and ports a single machine needs changed: the master on 127.0.0.1, each worker
serving its /metrics on its own loopback address (127.0.0.2, 127.0.0.3), as two hosts would. The
load is started the way a person does it, through the web UI's /swarm, at an in-process fake
OpenAI-style server, so no llama.cpp is needed.

The planned (headless) distributed path, `quantload load --workers N`, is covered against a real
llama-server by tests/integration/test_load_llama.py::test_distributed_master_and_two_workers.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import yaml

from quantload.llamacpp.server import free_port
from quantload.load.fakeserver import FakeScript, FakeServer

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
WORKER_ADDRESSES = ("127.0.0.2", "127.0.0.3")
USERS = 4
WANTED_RECORDS = 16
_DEFAULTED = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}")


def compose_command(service: str) -> list[str]:
    """A service's command from docker-compose.yml, every `${VAR:-default}` at its default."""
    data = yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))
    return [_DEFAULTED.sub(r"\1", str(arg)) for arg in data["services"][service]["command"]]


def with_options(argv: list[str], **values: str) -> list[str]:
    """`argv` with the value of each `--option` replaced (added when absent); `a_b` means --a-b."""
    result = list(argv)
    for key, value in values.items():
        option = "--" + key.replace("_", "-")
        if option in result:
            result[result.index(option) + 1] = value
        else:
            result += [option, value]
    return result


@dataclass
class Cluster:
    """A running master and two workers, and where to look at them."""

    web: str
    metrics_port: int
    out: Path
    fake_url: str
    processes: list[subprocess.Popen[bytes]]


def _environment(metrics_host: str) -> dict[str, str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("QUANTLOAD_")}
    environ.update(
        {
            "QUANTLOAD_LOAD__METRICS_HOST": metrics_host,
            "QUANTLOAD_LOAD__MAX_TOKENS": "8",
            "QUANTLOAD_LOAD__PROMPT_COUNT": "8",
            "PYTHONUNBUFFERED": "1",
        }
    )
    return environ


def _wait(condition: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {condition}")


def _stats(web: str) -> dict[str, object]:
    try:
        data: dict[str, object] = httpx.get(f"{web}/stats/requests", timeout=3).json()
    except (httpx.HTTPError, ValueError):
        return {}
    return data


def _records(out: Path) -> list[dict[str, object]]:
    path = out / "records.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _spawn(argv: list[str], metrics_host: str, log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as handle:  # the child keeps its own copy of the descriptor
        return subprocess.Popen(
            [sys.executable, "-m", *argv],
            cwd=REPO,
            env=_environment(metrics_host),
            stdout=handle,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    for process in processes:
        if process.poll() is None:
            process.terminate()
    for process in processes:
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("distributed")
    script = FakeScript(ttft_ms=(20.0, 60.0), itl_ms=(2.0, 5.0), tokens=8)
    web_port, master_port, metrics_port = free_port(), free_port(), free_port()
    out = tmp / "interactive"
    processes: list[subprocess.Popen[bytes]] = []
    with FakeServer(script) as fake:
        try:
            master = with_options(
                compose_command("locust-master"),
                web_host="127.0.0.1",
                web_port=str(web_port),
                master_bind_host="127.0.0.1",
                master_bind_port=str(master_port),
                host=fake.url,
                ql_out=str(out),
                ql_metrics_port=str(metrics_port),
            )
            processes.append(_spawn(master, "127.0.0.1", tmp / "master.log"))
            for index, address in enumerate(WORKER_ADDRESSES):
                worker = with_options(
                    compose_command("locust-worker"),
                    master_host="127.0.0.1",
                    master_port=str(master_port),
                    ql_metrics_port=str(metrics_port),
                )
                processes.append(_spawn(worker, address, tmp / f"worker{index}.log"))
            web = f"http://127.0.0.1:{web_port}"
            _wait("two workers at the master", lambda: _stats(web).get("worker_count") == 2, 90)
            form = {"user_count": USERS, "spawn_rate": USERS, "host": fake.url}
            started = httpx.post(f"{web}/swarm", data=form, timeout=10)
            assert started.status_code == 200 and started.json().get("success"), started.text
            _wait(f"{WANTED_RECORDS} records", lambda: len(_records(out)) >= WANTED_RECORDS, 90)
            yield Cluster(web, metrics_port, out, fake.url, processes)
        finally:
            _stop(processes)


def test_workers_on_two_hosts_send_records_to_the_master(cluster: Cluster) -> None:
    records = _records(cluster.out)
    assert len(records) >= WANTED_RECORDS
    assert all(r["ok"] for r in records), [r.get("error") for r in records if not r["ok"]][:3]
    assert len({r["worker"] for r in records}) == 2, "both workers should have sent requests"
    assert {r["experiment"] for r in records} == {"interactive"}
    # the labels compose gives master and workers alike
    assert {(r["server"], r["quant"], r["run_id"]) for r in records} == {
        ("llama-q4-k-m", "Q4_K_M", "compose-interactive")
    }


def test_the_web_ui_shows_time_to_first_token(cluster: Cluster) -> None:
    """Workers report their statistics to the master every few seconds; the UI shows them merged."""

    def rows() -> dict[str, int]:
        entries = _stats(cluster.web).get("stats") or []
        assert isinstance(entries, list)
        return {str(row["name"]): int(row["num_requests"]) for row in entries}

    _wait("TTFT and TPOT rows", lambda: rows().get("TTFT", 0) > 0 and rows().get("TPOT", 0) > 0, 30)
    workers = _stats(cluster.web)["workers"]
    assert isinstance(workers, list) and sum(w["user_count"] for w in workers) == USERS


def test_the_master_serves_its_metrics_where_prometheus_looks(cluster: Cluster) -> None:
    """prometheus.yml scrapes locust-master on the port compose gives --ql-metrics-port."""
    text = httpx.get(f"http://127.0.0.1:{cluster.metrics_port}/metrics", timeout=5).text
    assert 'quantload_active_users{quant="Q4_K_M",server="llama-q4-k-m"}' in text


def test_each_worker_serves_its_request_metrics_where_prometheus_looks(cluster: Cluster) -> None:
    for address in WORKER_ADDRESSES:
        try:
            text = httpx.get(f"http://{address}:{cluster.metrics_port}/metrics", timeout=5).text
        except httpx.HTTPError as error:
            raise AssertionError(f"no /metrics on {address}:{cluster.metrics_port}: {error}") from None
        assert "quantload_ttft_seconds_count{" in text, address
