"""One model split over two hosts (network namespaces): `quantload rpc-server` on the worker, the
head's llama-server offloading every layer to it (server.rpc), served and loaded; and the worker's
rpc-server killed mid-stage: the requests fail by class, the stage ends within its bound, and the
run goes on with the next server."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import netns_hosts
from netns_hosts import HostNetwork, host_network
from quantload.llamacpp.rpc_server import status_port
from quantload.llamacpp.toolchain import Toolchain
from support import missing

pytestmark = [pytest.mark.integration, pytest.mark.slow]
DRIVER = Path(__file__).resolve().parents[1] / "rpc_split_driver.py"
RPC_PORT = 50052
FAILED_CLASSES = {"stream_cut", "connect_refused", "connect_error", "http_5xx", "timeout", "aborted"}


@pytest.fixture
def split(toolchain: Toolchain, tmp_path: Path) -> Iterator[tuple[HostNetwork, str]]:
    """Two hosts, head and worker, with `quantload rpc-server` serving on the worker."""
    reason = netns_hosts.unavailable()
    if reason:
        missing(reason)
    if "ggml-rpc-server" not in toolchain.tools:
        missing("this llama.cpp has no ggml-rpc-server: run `quantload toolchain` (it builds with GGML_RPC=ON)")
    bins = toolchain.path("ggml-rpc-server").parent
    with host_network(["head", "worker"]) as network:
        worker = network["worker"].address
        network.spawn(
            "worker",
            [sys.executable, "-m", "quantload.cli.main", "rpc-server", "--host", worker, "--port", str(RPC_PORT),
             "--threads", "1", "--log", str(tmp_path / "rpc-server.log"), "--linger", "5"],
            tmp_path / "rpc-cli.log", env={**os.environ, "QUANTLOAD_LLAMA_BIN": str(bins)},
        )  # fmt: skip
        network.wait_listening("head", worker, status_port(RPC_PORT), 60)
        yield network, f"{worker}:{RPC_PORT}"


def _driver_command(toolchain: Toolchain, model: Path, endpoint: str, out: Path, *extra: str) -> list[str]:
    """The head's driver (tests/rpc_split_driver.py) serving `model` split over `endpoint`."""
    bins = toolchain.path("llama-server").parent
    return [sys.executable, str(DRIVER), "--model", str(model), "--rpc", endpoint, "--out", str(out),
            "--llama-bin", str(bins), *extra]  # fmt: skip


def _results(log: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]


def test_a_model_split_over_two_hosts_is_served_and_loaded(
    split: tuple[HostNetwork, str], toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    network, endpoint = split
    command = _driver_command(toolchain, tiny_models["Q4_K_M"], endpoint, tmp_path)
    result = network.run("head", command, timeout_s=300)
    assert result.returncode == 0, result.stderr[-3000:]
    done = next(r for r in map(json.loads, result.stdout.splitlines()) if r["event"] == "done")
    # each level sends at least its 4 planned requests, more while its verdict is undecided
    assert [(s["users"], s["status"], s["failed"]) for s in done["summaries"]] == [(1, "ok", 0), (2, "ok", 0)]
    assert all(s["ok"] >= 4 for s in done["summaries"]), done["summaries"]
    on_worker = {name: mib for name, mib in done["model_buffers_mib"].items() if endpoint in name}
    assert on_worker and max(on_worker.values()) > 10, done["model_buffers_mib"]  # the weights live there
    assert done["quantload_lines"] == [] and done["exit_code"] is not None


def _rpc_server_pid(port: int) -> int:
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"ggml-rpc-server") and str(port).encode() in argv:
            return int(entry.name)
    raise AssertionError(f"no ggml-rpc-server on port {port}")


def _fault_mid_stage(
    network: HostNetwork, toolchain: Toolchain, model: Path, endpoint: str, out: Path, fault: Callable[[], None]
) -> tuple[dict[str, Any], dict[str, Any], float]:
    """The driver's split stage under way, then `fault`; (the split run, the run alone after it,
    seconds from the fault to the driver's end)."""
    command = _driver_command(toolchain, model, endpoint, out, "--users", "1", "--prompts", "40",
                              "--max-tokens", "32", "--stage-timeout-s", "120", "--lost-after-s", "5",
                              "--then-alone")  # fmt: skip
    log = out / "driver.log"
    driver = network.spawn("head", command, log)
    records = out / "split" / "records.jsonl"
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # a few requests answered: the stage is under way
        measured = [json.loads(x) for x in records.read_text().splitlines()] if records.exists() else []
        if sum(1 for r in measured if not r.get("warmup") and r.get("ok")) >= 2:
            break
        assert driver.poll() is None, log.read_text()[-3000:]
        time.sleep(0.2)
    else:
        raise AssertionError("the split stage never got under way")
    faulted_at = time.monotonic()
    fault()
    driver.wait(timeout=240)
    took_s = time.monotonic() - faulted_at
    assert driver.returncode == 0, log.read_text()[-3000:]
    split_run, alone = [r for r in _results(log) if r["event"] == "done"]
    return split_run, alone, took_s


def _failed_by_class_and_went_on(split_run: dict[str, Any], alone: dict[str, Any]) -> None:
    (stage,) = split_run["summaries"]
    # the stage ends either way the failures end it: the circuit breaker ("failed") or its level
    # decided that it misses the SLO (the refused requests count against it), whichever comes first
    ended_by_failures = stage["status"] != "ok" or stage["level_outcome"] == "misses"
    assert ended_by_failures and stage["failed"] >= 1 and stage["ok"] >= 2, stage
    assert set(stage["errors"]) <= FAILED_CLASSES and stage["errors"], stage["errors"]
    assert split_run["alive_at_end"] is False  # the server ended with its RPC host
    (after,) = alone["summaries"]
    assert after["status"] == "ok" and after["ok"] >= 2 and not after["failed"]  # the next server as usual


def test_an_rpc_server_that_dies_mid_stage_fails_its_requests_by_class_and_the_run_goes_on(
    split: tuple[HostNetwork, str], toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    network, endpoint = split
    kill = lambda: os.kill(_rpc_server_pid(RPC_PORT), signal.SIGKILL)  # noqa: E731
    split_run, alone, took_s = _fault_mid_stage(network, toolchain, tiny_models["Q4_K_M"], endpoint, tmp_path, kill)
    _failed_by_class_and_went_on(split_run, alone)
    assert split_run["rpc_crash"] or any("exited" in line for line in split_run["quantload_lines"])
    assert took_s < 120, f"the fault took {took_s:.0f} s to end the stage"


@pytest.mark.long
def test_an_rpc_host_cut_off_mid_stage_stops_its_server_within_the_bound(
    split: tuple[HostNetwork, str], toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    """A partition leaves llama-server waiting on its socket: the watch stops it once the host's
    status has been silent for server.rpc_lost_after_s (5 s here)."""
    network, endpoint = split
    try:
        split_run, alone, took_s = _fault_mid_stage(
            network, toolchain, tiny_models["Q4_K_M"], endpoint, tmp_path, lambda: network.link_down("worker")
        )
    finally:
        network.link_up("worker")
    _failed_by_class_and_went_on(split_run, alone)
    assert any("has not answered for" in line for line in split_run["quantload_lines"]), split_run
    assert took_s < 90, f"the partition took {took_s:.0f} s to end the stage"
