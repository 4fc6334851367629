"""Expert placement and a model split over RPC hosts, without llama.cpp: the flags quantload
passes, the one-line refusals of settings, and the watch that stops a llama-server whose RPC host
is lost.

With processes (the refusals before a server starts, which run `llama-server --list-devices`; the
ggml-rpc-server process and its status endpoint): tests/integration/test_placement_rpc_processes.py.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from pydantic import ValidationError

from placement_fakes import CPU_ONLY_LIST, RPC_LIST
from quantload.config import ServerSettings, Settings, TuneSettings
from quantload.errors import ConfigError
from quantload.llamacpp.devices import Device, parse_devices
from quantload.llamacpp.placement import check_placement, placement_args
from quantload.llamacpp.rpc_server import status_port
from quantload.llamacpp.rpc_watch import RpcWatch
from quantload.llamacpp.server import ServerSpec, free_port
from quantload.llamacpp.server_help import ServerBuild
from quantload.tune.space import TuneConfig, check_space

GPU = Device("CUDA0", "NVIDIA H200", 143_000, 140_000)
BUILD = ServerBuild(frozenset({"--parallel"}), ("f16", "q8_0"), ("none",))


@pytest.mark.parametrize(
    ("placement", "args"),
    [
        ("none", ()),
        ("cpu-moe", ("--cpu-moe",)),
        ("n-cpu-moe:3", ("--n-cpu-moe", "3")),
        ("ot:exps=CPU", ("--override-tensor", "exps=CPU")),
        (
            "ot:blk\\.[0-3]\\.ffn_.*_exps=CPU,attn=CUDA0",
            ("--override-tensor", "blk\\.[0-3]\\.ffn_.*_exps=CPU,attn=CUDA0"),
        ),
    ],
)
def test_each_placement_is_its_llama_server_flags(placement: str, args: tuple[str, ...]) -> None:
    assert placement_args(placement) == args


@pytest.mark.parametrize(
    "placement", ["gpu", "n-cpu-moe:", "n-cpu-moe:-1", "ot:", "ot:exps", "none:1", "cpu-moe:2"]
)
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


# ---------------------------------------------------------------------------- the watch


class _Status:
    """A status endpoint whose answer the test sets: 200, 503 (exited), or silence (stopped)."""

    def __init__(self) -> None:
        self.code = 200
        rpc_port = free_port()
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
    endpoint = f"127.0.0.1:{free_port()}"
    watch = RpcWatch([endpoint], lost_after_s=0.2, on_lost=lost.append, poll_s=0.05).start()
    time.sleep(0.5)
    watch.stop()
    assert watch.unwatched == (endpoint,) and watch.watched == () and lost == []
