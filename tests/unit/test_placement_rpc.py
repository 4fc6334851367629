"""Expert placement and a model split over RPC hosts, without llama.cpp: the flags quantload
passes, the one-line refusals before any server starts, the ggml-rpc-server process and its status
endpoint, and the watch that stops a llama-server whose RPC host is lost."""

from __future__ import annotations

import json
import os
import socket
import stat
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from quantload.config import ServerSettings, Settings, TuneSettings
from quantload.errors import ConfigError, ServerError
from quantload.llamacpp.devices import Device, parse_devices
from quantload.llamacpp.placement import check_placement, placement_args
from quantload.llamacpp.rpc_server import RpcServer, RpcServerSpec, listening_on, serve_status, status_port
from quantload.llamacpp.rpc_watch import RpcWatch
from quantload.llamacpp.server import LlamaServer, ServerSpec
from quantload.llamacpp.server_help import ServerBuild
from quantload.llamacpp.toolchain import Toolchain
from quantload.tune.space import TuneConfig, check_space

GPU = Device("CUDA0", "NVIDIA H200", 143_000, 140_000)
CPU_ONLY_LIST = "Available devices:\n  (none)\n"
RPC_LIST = "Available devices:\n  RPC0[10.213.77.11:50052]: RPC0 (23962 MiB, 20480 MiB free)\n"
BUILD = ServerBuild(frozenset({"--parallel"}), ("f16", "q8_0"), ("none",))


@pytest.mark.parametrize(
    ("placement", "args"),
    [
        ("none", ()),
        ("cpu-moe", ("--cpu-moe",)),
        ("n-cpu-moe:3", ("--n-cpu-moe", "3")),
        ("ot:exps=CPU", ("--override-tensor", "exps=CPU")),
        ("ot:blk\\.[0-3]\\.ffn_.*_exps=CPU,attn=CUDA0", ("--override-tensor", "blk\\.[0-3]\\.ffn_.*_exps=CPU,attn=CUDA0")),
    ],
)
def test_each_placement_is_its_llama_server_flags(placement: str, args: tuple[str, ...]) -> None:
    assert placement_args(placement) == args


@pytest.mark.parametrize("placement", ["gpu", "n-cpu-moe:", "n-cpu-moe:-1", "ot:", "ot:exps", "none:1", "cpu-moe:2"])
def test_anything_else_is_refused_naming_the_forms(placement: str) -> None:
    with pytest.raises(ValidationError, match="is no expert placement: use none, cpu-moe, n-cpu-moe:N"):
        ServerSettings(expert_placement=placement)
    with pytest.raises(ValidationError, match="is no expert placement"):
        TuneSettings(expert_placement=("none", placement))


def test_placement_on_a_cpu_only_machine_is_refused_in_one_line() -> None:
    with pytest.raises(ConfigError) as caught:
        check_placement([("server.expert_placement", "none"), ("tune.expert_placement", "n-cpu-moe:2")], ())
    line = caught.value.one_line()
    assert line.startswith("tune.expert_placement = 'n-cpu-moe:2' keeps experts in host memory")
    assert "no device besides the CPU" in line and "\n" not in line
    check_placement([("tune.expert_placement", "n-cpu-moe:2")], (GPU,))  # a GPU: fine
    check_placement([("server.expert_placement", "none")], ())  # nothing placed: fine


def test_the_device_list_says_cpu_only_rpc_hosts_or_nothing() -> None:
    assert parse_devices(CPU_ONLY_LIST) == ()
    (rpc,) = parse_devices(RPC_LIST) or ()
    assert (rpc.name, rpc.total_mib, rpc.free_mib) == ("RPC0[10.213.77.11:50052]", 23962, 20480)
    assert parse_devices("error: unknown argument") is None


def test_a_split_server_offloads_every_layer_to_its_rpc_hosts(tmp_path: Path) -> None:
    spec = ServerSpec(tmp_path / "m.gguf", "m", rpc=("10.0.0.2:50052", "10.0.0.3:50052"))
    command = spec.command(Path("llama-server"), 8080)
    assert command[command.index("--rpc") + 1] == "10.0.0.2:50052,10.0.0.3:50052"
    assert command[command.index("-ngl") + 1] == "all"
    partial = ServerSpec(tmp_path / "m.gguf", "m", rpc=("10.0.0.2:50052",), gpu_layers=12)
    assert partial.command(Path("llama-server"), 8080).count("-ngl") == 1
    assert "12" in partial.command(Path("llama-server"), 8080)
    placed = ServerSpec(tmp_path / "m.gguf", "m", expert_placement="n-cpu-moe:2")
    assert placed.command(Path("llama-server"), 8080)[-2:] == ["--n-cpu-moe", "2"]
    assert "--rpc" not in placed.command(Path("llama-server"), 8080)
    settings = ServerSettings(rpc=("10.0.0.2:50052",), rpc_lost_after_s=3.0, expert_placement="cpu-moe")
    from_settings = ServerSpec.from_settings(settings, tmp_path / "m.gguf", "m")
    assert (from_settings.rpc, from_settings.rpc_lost_after_s, from_settings.expert_placement) == (
        ("10.0.0.2:50052",), 3.0, "cpu-moe",
    )  # fmt: skip


@pytest.mark.parametrize("endpoint", ["10.0.0.2", ":50052", "10.0.0.2:0", "10.0.0.2:70000", "host:port"])
def test_an_rpc_host_that_is_not_host_port_is_refused(endpoint: str) -> None:
    with pytest.raises(ValidationError, match="is not HOST:PORT"):
        ServerSettings(rpc=(endpoint,))


def test_a_split_model_cannot_serve_its_files_at_once() -> None:
    with pytest.raises(ValidationError, match="serves one llama-server at a time"):
        Settings(server=ServerSettings(rpc=("10.0.0.2:50052",)), run={"servers_at_once": True})


def test_the_tune_space_places_experts_only_where_there_is_a_device() -> None:
    settings = Settings(tune=TuneSettings(slots=(4,), batch_sizes=("256/256",), cache_types=("f16",),
                                          expert_placement=("none", "n-cpu-moe:1")))  # fmt: skip
    with pytest.raises(ConfigError, match=r"tune\.expert_placement = 'n-cpu-moe:1'"):
        check_space(settings, BUILD, devices=())
    plain, placed = check_space(settings, BUILD, devices=(GPU,))
    assert placed.key == plain.key + " moe-n-cpu-moe:1"
    assert placed.args(settings)[-2:] == ("--n-cpu-moe", "1")
    assert "--n-cpu-moe" not in plain.args(settings)
    assert TuneConfig(4, 4096, "256/256", "f16", "auto", 0, "continuous", "none").key.endswith("spec-none")
    both = settings.model_copy(update={"server": ServerSettings(expert_placement="cpu-moe")})
    with pytest.raises(ConfigError, match=r"while server\.expert_placement = 'cpu-moe' is added") as caught:
        check_space(both, BUILD, devices=(GPU,))
    assert caught.value.hint == "set server.expert_placement to none when the tune searches placements"


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
    with pytest.raises(ConfigError, match=r"server\.expert_placement = 'cpu-moe' keeps experts in host memory"):
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
    assert (tmp_path / "bin" / "calls.txt").read_text().splitlines() == ["--rpc 10.0.0.9:50052 --list-devices"]


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


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def rpc_tools(tmp_path: Path) -> Toolchain:
    tool = tmp_path / "ggml-rpc-server"
    tool.write_text(f"#!{sys.executable}\n{FAKE_RPC_SERVER}")
    tool.chmod(tool.stat().st_mode | stat.S_IXUSR)
    return Toolchain({"llama-server": tool, "ggml-rpc-server": tool}, "QUANTLOAD_LLAMA_BIN", "version: fake")


def test_the_rpc_server_is_ready_once_its_port_listens_and_its_status_says_how_it_is(
    tmp_path: Path, rpc_tools: Toolchain
) -> None:
    port = _free_port()
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
        server.stop()


def test_an_rpc_server_whose_port_is_taken_fails_in_one_line(tmp_path: Path, rpc_tools: Toolchain) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        server = RpcServer(rpc_tools, RpcServerSpec("127.0.0.1", port), tmp_path / "rpc.log", startup_timeout_s=5)
        with pytest.raises(Exception, match=f"ggml-rpc-server on 127.0.0.1:{port} did not start"):
            server.start()
        assert not server.alive()


# ---------------------------------------------------------------------------- the watch


class _Status:
    """A status endpoint whose answer the test sets: 200, 503 (exited), or silence (stopped)."""

    def __init__(self) -> None:
        self.code = 200
        rpc_port = _free_port()
        self.endpoint = f"127.0.0.1:{rpc_port}"
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = json.dumps({"exit_code": 3 if outer.code == 503 else None}).encode()
                self.send_response(outer.code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self.http = ThreadingHTTPServer(("127.0.0.1", status_port(rpc_port)), Handler)
        threading.Thread(target=self.http.serve_forever, daemon=True).start()

    def silence(self) -> None:
        self.http.shutdown()
        self.http.server_close()


@pytest.fixture
def status() -> Iterator[_Status]:
    made = _Status()
    yield made
    made.silence()


def _watch_until_lost(watch: RpcWatch, lost: list[str], bound_s: float) -> float:
    started = time.monotonic()
    while not lost and time.monotonic() - started < bound_s:
        time.sleep(0.05)
    watch.stop()
    return time.monotonic() - started


def test_an_rpc_server_that_exits_is_lost_at_once(status: _Status) -> None:
    lost: list[str] = []
    watch = RpcWatch([status.endpoint], lost_after_s=30, on_lost=lost.append, poll_s=0.1).start()
    assert watch.watched == (status.endpoint,)
    status.code = 503
    took = _watch_until_lost(watch, lost, 10)
    assert lost == [f"the rpc-server at {status.endpoint} exited (code 3)"] and took < 5


def test_a_silent_rpc_host_is_lost_after_its_bound_and_not_before(status: _Status) -> None:
    lost: list[str] = []
    watch = RpcWatch([status.endpoint], lost_after_s=1.0, on_lost=lost.append, poll_s=0.1).start()
    time.sleep(0.5)
    assert not lost
    status.silence()
    took = _watch_until_lost(watch, lost, 10)
    assert len(lost) == 1 and "has not answered for" in lost[0] and "(partitioned or down)" in lost[0]
    assert 0.9 < took < 5


def test_an_rpc_host_without_a_status_endpoint_is_named_and_not_watched() -> None:
    lost: list[str] = []
    endpoint = f"127.0.0.1:{_free_port()}"
    watch = RpcWatch([endpoint], lost_after_s=0.2, on_lost=lost.append, poll_s=0.05).start()
    time.sleep(0.5)
    watch.stop()
    assert watch.unwatched == (endpoint,) and watch.watched == () and lost == []
