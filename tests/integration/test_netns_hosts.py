"""The test hosts themselves (tests/netns_hosts.py): addresses, partitions, rate limits, the delaying
relay (tests/netns_relay.py), and that nothing is left behind, also when a test fails."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import netns_hosts
from netns_hosts import HostNetwork, host_network
from support import missing

pytestmark = pytest.mark.slow
RELAY = Path(__file__).resolve().parents[1] / "netns_relay.py"
HTTP_PORT = 8000
RELAY_PORT = 8001
PAYLOAD = "payload.bin"


@pytest.fixture(scope="module")
def network(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HostNetwork]:
    reason = netns_hosts.unavailable()
    if reason:
        missing(reason)
    logs = tmp_path_factory.mktemp("netns-logs")
    (logs / PAYLOAD).write_bytes(os.urandom(96 * 1024))  # http.server serves its working folder
    with host_network(["web", "client", "relay"]) as made:
        web = made["web"]
        made.spawn("web", [sys.executable, "-m", "http.server", str(HTTP_PORT), "--bind", web.address],
                   logs / "web.log", cwd=logs)  # fmt: skip
        made.wait_listening("client", web.address, HTTP_PORT, 30)
        yield made


def _timed_get(network: HostNetwork, host: str, url: str) -> float:
    code = (
        "import time, urllib.request\n"
        f"start = time.perf_counter(); urllib.request.urlopen({url!r}, timeout=20).read()\n"
        "print(time.perf_counter() - start)\n"
    )
    return float(network.python(host, code, 40))


def test_hosts_reach_each_other_on_their_own_addresses_only(network: HostNetwork) -> None:
    web = network["web"]
    assert "Directory listing" in network.get("client", web.url(HTTP_PORT, "/"))
    mine = subprocess.run(["ip", "-4", "-o", "addr"], capture_output=True, text=True, check=True).stdout
    assert netns_hosts.SUBNET not in mine, "nothing of the test network is in the namespace the tests run in"


def test_a_link_taken_down_cuts_the_host_off_until_it_comes_back(network: HostNetwork) -> None:
    web = network["web"]
    probe = (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(({web.address!r}, {HTTP_PORT}), 2).close(); print('reached')\n"
        "except OSError as error:\n"
        "    print('cut', type(error).__name__)\n"
    )
    network.link_down("web")
    try:
        assert network.python("client", probe).startswith("cut")
    finally:
        network.link_up("web")
    network.wait_listening("client", web.address, HTTP_PORT, 20)
    assert network.python("client", probe).strip() == "reached"


def test_a_rate_limit_slows_what_the_host_sends(network: HostNetwork) -> None:
    url = network["web"].url(HTTP_PORT, f"/{PAYLOAD}")
    unlimited_s = _timed_get(network, "client", url)
    network.limit_rate("web", 256)  # 32 KB/s: the 96 KiB take about 3 s
    try:
        limited_s = _timed_get(network, "client", url)
    finally:
        network.clear_limit("web")
    assert limited_s > 1.5 and limited_s > 3 * unlimited_s, (unlimited_s, limited_s)


def test_the_relay_adds_its_round_trip_time(network: HostNetwork, tmp_path: Path) -> None:
    web, relay = network["web"], network["relay"]
    network.spawn(
        "relay",
        [sys.executable, str(RELAY), "--listen", f"{relay.address}:{RELAY_PORT}",
         "--to", f"{web.address}:{HTTP_PORT}", "--rtt-ms", "300"],
        tmp_path / "relay.log",
    )  # fmt: skip
    network.wait_listening("client", relay.address, RELAY_PORT, 30)
    direct = min(_timed_get(network, "client", web.url(HTTP_PORT, "/")) for _ in range(2))
    relayed = min(_timed_get(network, "client", relay.url(RELAY_PORT, "/")) for _ in range(2))
    assert relayed - direct > 0.25, (direct, relayed)  # at least the round trip (a lower bound only)


def test_stale_namespaces_are_swept_and_live_ones_kept() -> None:
    reason = netns_hosts.unavailable()
    if reason:
        missing(reason)
    dead = _dead_pid()
    stale = f"{netns_hosts.PREFIX}{dead}-abc123-server"
    live = f"{netns_hosts.PREFIX}{os.getpid()}-def456-server"
    for name in (stale, live):
        subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        removed = netns_hosts.sweep_stale()
        assert stale in removed and live not in removed
        assert stale not in netns_hosts.namespaces() and live in netns_hosts.namespaces()
    finally:
        for name in (stale, live):
            subprocess.run(["ip", "netns", "del", name], check=False, capture_output=True)


def test_a_failing_test_still_leaves_nothing_behind(tmp_path: Path) -> None:
    reason = netns_hosts.unavailable()
    if reason:
        missing(reason)
    made: HostNetwork | None = None
    with pytest.raises(RuntimeError, match="the test failed"), host_network(["a", "b"]) as network:
        made = network
        sleeper = network.spawn("a", [sys.executable, "-c", "import time; time.sleep(600)"], tmp_path / "a.log")
        time.sleep(0.3)
        assert sleeper.poll() is None
        raise RuntimeError("the test failed")
    assert made is not None and made.leftovers() == []
    assert sleeper.poll() is not None


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_a_run_stopped_with_sigterm_still_removes_its_hosts(tmp_path: Path) -> None:
    reason = netns_hosts.unavailable()
    if reason:
        missing(reason)
    script = (
        "import sys, time\n"
        f"sys.path.insert(0, {str(Path(netns_hosts.__file__).parent)!r})\n"
        "from pathlib import Path\n"
        "from netns_hosts import host_network\n"
        "with host_network(['a']) as network:\n"
        f"    sleeper = network.spawn('a', [sys.executable, '-c', 'import time; time.sleep(600)'], Path({str(tmp_path / 'a.log')!r}))\n"
        "    print(network.tag, sleeper.pid, flush=True)\n"
        "    time.sleep(600)\n"
    )
    process = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert process.stdout is not None
    tag, pid = process.stdout.readline().split()
    assert any(name.startswith(tag) for name in netns_hosts.namespaces())
    process.terminate()
    assert process.wait(60) != 0  # interrupted, after removing what it made
    assert not [name for name in netns_hosts.namespaces() if name.startswith(tag)]
    assert not Path(f"/proc/{pid}").exists()
