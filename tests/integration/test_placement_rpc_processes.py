"""Expert placement and a model split over RPC hosts, with processes standing in for llama.cpp: a
server is refused in one line before it starts (after `llama-server --list-devices`, a shell
script here), and the ggml-rpc-server process (a child Python) is ready once its port listens,
its status endpoint says how it is, and a taken port fails in one line.

Moved from tests/unit/test_placement_rpc.py, whose other tests start no process.
"""

from __future__ import annotations

import os
import socket
import stat
import sys
import time
from pathlib import Path

import httpx
import pytest

from placement_fakes import CPU_ONLY_LIST
from quantload.errors import ConfigError, ServerError
from quantload.llamacpp.rpc_server import RpcServer, RpcServerSpec, listening_on, serve_status, status_port
from quantload.llamacpp.server import LlamaServer, ServerSpec, free_port
from quantload.llamacpp.toolchain import Toolchain

pytestmark = pytest.mark.integration


def _fake_tools(folder: Path) -> Toolchain:
    """A llama-server that records each call and lists the devices $DEVICES holds; nothing else."""
    folder.mkdir(parents=True, exist_ok=True)
    server = folder / "llama-server"
    calls = folder / "calls.txt"
    server.write_text(
        "#!/bin/sh\n"
        f'echo "$@" >> {calls}\n'
        'case "$*" in *--list-devices*) printf "%s" "$DEVICES"; exit 0;; esac\n'
        "sleep 30\n"
    )
    server.chmod(server.stat().st_mode | stat.S_IXUSR)
    return Toolchain({"llama-server": server}, "QUANTLOAD_LLAMA_BIN", "version: fake")


def test_a_server_placing_experts_on_a_cpu_only_build_is_refused_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEVICES", CPU_ONLY_LIST)
    toolchain = _fake_tools(tmp_path / "bin")
    spec = ServerSpec(tmp_path / "m.gguf", "m", expert_placement="cpu-moe")
    server = LlamaServer(toolchain, spec, tmp_path / "server.log", startup_timeout_s=5)
    with pytest.raises(
        ConfigError, match=r"server\.expert_placement = 'cpu-moe' keeps experts in host memory"
    ):
        server.start()
    calls = (tmp_path / "bin" / "calls.txt").read_text().splitlines()
    assert calls == ["--list-devices"], "only the device list ran: no server was started"
    assert server.pid is None


def test_a_split_server_whose_rpc_host_does_not_answer_is_refused_before_it_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """llama-server --rpc H:P --list-devices aborts when it cannot connect: one line, no server."""
    toolchain = _fake_tools(tmp_path / "bin")
    server = toolchain.path("llama-server")
    server.write_text(server.read_text().replace(
        'case "$*" in', 'case "$*" in *--rpc*) echo "Failed to connect to 10.0.0.9:50052" >&2; exit 134;; esac\ncase "$*" in'
    ))  # fmt: skip
    spec = ServerSpec(tmp_path / "m.gguf", "m", rpc=("10.0.0.9:50052",))
    with pytest.raises(ServerError) as caught:
        LlamaServer(toolchain, spec, tmp_path / "server.log", startup_timeout_s=5).start()
    assert caught.value.one_line() == (
        "llama-server could not reach its RPC hosts 10.0.0.9:50052: Failed to connect to 10.0.0.9:50052"
        " (start `quantload rpc-server` on each host, or fix server.rpc)"
    )
    assert (tmp_path / "bin" / "calls.txt").read_text().splitlines() == [
        "--rpc 10.0.0.9:50052 --list-devices"
    ]


# ---------------------------------------------------------------------------- rpc-server process

FAKE_RPC_SERVER = """\
import socket, sys, time
args = sys.argv[1:]
host, port = args[args.index("-H") + 1], int(args[args.index("-p") + 1])
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind((host, port))
listener.listen(1)
while True:
    client, _ = listener.accept()
    print("Accepted client connection", flush=True)
    if client.recv(16) == b"exit":
        sys.exit(3)
    client.close()
    print("Client connection closed", flush=True)
"""


@pytest.fixture
def rpc_tools(tmp_path: Path) -> Toolchain:
    tool = tmp_path / "ggml-rpc-server"
    tool.write_text(f"#!{sys.executable}\n{FAKE_RPC_SERVER}")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return Toolchain({"llama-server": tool, "ggml-rpc-server": tool}, "QUANTLOAD_LLAMA_BIN", "version: fake")


def test_the_rpc_server_is_ready_once_its_port_listens_and_its_status_says_how_it_is(
    tmp_path: Path, rpc_tools: Toolchain
) -> None:
    port = free_port()
    assert not listening_on(port)
    server = RpcServer(rpc_tools, RpcServerSpec("127.0.0.1", port), tmp_path / "rpc.log").start()
    status = serve_status(server, "127.0.0.1", status_port(port))
    try:
        assert listening_on(port) and listening_on(port, server.pid) and not listening_on(port, os.getpid())
        url = f"http://127.0.0.1:{status_port(port)}/status"
        first = httpx.get(url, timeout=5)
        assert first.status_code == 200 and first.json()["rpc_server"] == "running"
        with socket.create_connection(("127.0.0.1", port)) as client:
            deadline = time.monotonic() + 5
            while httpx.get(url, timeout=5).json()["client"] != "connected" and time.monotonic() < deadline:
                time.sleep(0.05)
            assert httpx.get(url, timeout=5).json()["client"] == "connected"
            client.sendall(b"exit")
        deadline = time.monotonic() + 5
        while server.exit_code() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        gone = httpx.get(url, timeout=5)
        assert gone.status_code == 503 and gone.json() | {"pid": 0} == {
            "endpoint": f"127.0.0.1:{port}", "rpc_server": "exited", "exit_code": 3, "client": "none", "pid": 0,
        }  # fmt: skip
    finally:
        status.shutdown()
        status.server_close()
        server.stop()


def test_an_rpc_server_whose_port_is_taken_fails_in_one_line(tmp_path: Path, rpc_tools: Toolchain) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        server = RpcServer(
            rpc_tools, RpcServerSpec("127.0.0.1", port), tmp_path / "rpc.log", startup_timeout_s=5
        )
        with pytest.raises(Exception, match=f"ggml-rpc-server on 127.0.0.1:{port} did not start"):
            server.start()
        assert not server.alive()
