"""Starting, watching and stopping one llama-server process.

Before a llama-server that is split over RPC hosts or places experts starts, its own
`--list-devices` (with `--rpc`) says whether every RPC host answers and whether there is a device
besides the CPU to place experts away from (quantload.llamacpp.devices, .placement): either problem
is one line and no server starts. While it runs, its RPC hosts are watched
(quantload.llamacpp.rpc_watch): a lost host stops it, so its requests fail instead of hanging.
"""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, field
from pathlib import Path

from quantload.childproc import POLL_S, LoggedProcess
from quantload.config import ServerSettings
from quantload.errors import ServerError
from quantload.exclusive import pin_process
from quantload.llamacpp.devices import list_devices
from quantload.llamacpp.offload import GpuLayers, gpu_layer_args
from quantload.llamacpp.placement import check_placement, placement_args
from quantload.llamacpp.rpc_watch import RpcWatch
from quantload.llamacpp.toolchain import Toolchain

PORT_ATTEMPTS = 3
API_KEY_ENV = "LLAMA_API_KEY"


@dataclass(frozen=True)
class ServerSpec:
    """Everything that decides how a llama-server is launched."""

    model_path: Path
    alias: str
    slots: int = 8
    ctx_per_slot: int = 4096
    host: str = "127.0.0.1"
    port: int = 0  # 0 = pick a free one
    kv_unified: bool = False
    cache_type_k: str = "f16"
    cache_type_v: str = "f16"
    threads: int = 0
    gpu_layers: GpuLayers = "auto"  # passed always: 0 keeps a GPU build on the CPU
    api_key: str | None = None
    verbosity: int = 4
    slot_save_path: Path | None = None  # enables /slots actions (erase) for a known cache state
    extra_args: tuple[str, ...] = field(default_factory=tuple)
    cpus: frozenset[int] | None = None  # the cores it runs on (load.exclusive); None: any
    rpc: tuple[str, ...] = ()  # HOST:PORT of the ggml-rpc-servers the model is split over
    rpc_lost_after_s: float = 10.0  # a watched RPC host silent this long stops the server
    expert_placement: str = "none"  # quantload.llamacpp.placement

    @classmethod
    def from_settings(cls, settings: ServerSettings, model_path: Path, alias: str) -> ServerSpec:
        """A spec from the [server] settings."""
        return cls(
            model_path=model_path,
            alias=alias,
            slots=settings.slots,
            ctx_per_slot=settings.ctx_per_slot,
            host=settings.host,
            kv_unified=settings.kv_unified,
            cache_type_k=settings.cache_type_k,
            cache_type_v=settings.cache_type_v,
            threads=settings.threads,
            gpu_layers=settings.gpu_layers,
            api_key=settings.api_key.get_secret_value() if settings.api_key else None,
            extra_args=settings.extra_args,
            rpc=settings.rpc,
            rpc_lost_after_s=settings.rpc_lost_after_s,
            expert_placement=settings.expert_placement,
        )

    def command(self, server_binary: Path, port: int) -> list[str]:
        """The llama-server command line for this spec on `port` (the API key is not in it:
        see `secret_env`)."""
        args = [
            str(server_binary),
            "-m", str(self.model_path),
            "--alias", self.alias,
            "--host", self.host,
            "--port", str(port),
            "-np", str(self.slots),
            "-c", str(self.slots * self.ctx_per_slot),
            "-kvu" if self.kv_unified else "-no-kvu",
            "-ctk", self.cache_type_k,
            "-ctv", self.cache_type_v,
            "--metrics",
            "--no-webui",
            "-lv", str(self.verbosity),
        ]
        if self.threads:
            args += ["-t", str(self.threads)]
        elif self.cpus:  # pinned: one thread per core it has, not one per core of the machine
            args += ["-t", str(len(self.cpus))]
        if self.rpc:  # split over hosts: every layer on the RPC devices unless told otherwise
            args += ["--rpc", ",".join(self.rpc)]
        layers: GpuLayers = "all" if self.rpc and self.gpu_layers == "auto" else self.gpu_layers
        args += gpu_layer_args("llama-server", layers)
        args += placement_args(self.expert_placement)
        if self.slot_save_path is not None:
            args += ["--slot-save-path", str(self.slot_save_path)]
        return [*args, *self.extra_args]

    def secret_env(self) -> dict[str, str]:
        """The environment that carries the API key: llama-server reads LLAMA_API_KEY like
        --api-key (common/arg.cpp), and the environment is not shown by `ps` or in logs."""
        return {API_KEY_ENV: self.api_key} if self.api_key else {}


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return int(probe.getsockname()[1])


def port_is_free(host: str, port: int) -> bool:
    """True when a server can listen on `port` of `host`: nobody listens on it.

    Connections of a server stopped a moment ago linger in TIME_WAIT and make a plain bind fail;
    llama-server binds over them (its HTTP library sets SO_REUSEPORT), so a port that refuses
    connections counts as free too.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            pass
        else:
            return True
    try:
        socket.create_connection((host, port), timeout=1.0).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


class LlamaServer(LoggedProcess):
    """A running llama-server whose output goes to `log_path`. Use as a context manager."""

    def __init__(
        self, toolchain: Toolchain, spec: ServerSpec, log_path: Path, startup_timeout_s: float = 180.0
    ) -> None:
        super().__init__(log_path)
        self.toolchain = toolchain
        self.spec = spec
        self.startup_timeout_s = startup_timeout_s
        self.port = 0
        self.rpc_watch: RpcWatch | None = None
        self.lost: str | None = None  # why the server was stopped for a lost RPC host

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.port}"

    def start(self) -> LlamaServer:
        """Launch and wait until /health answers 200; raise ServerError if it cannot (and
        ConfigError, before launching, for an expert placement with nowhere to place from)."""
        self.check_devices()
        wanted = self.spec.port
        for attempt in range(PORT_ATTEMPTS):
            self.port = wanted if wanted and attempt == 0 else free_port(self.spec.host)
            if wanted and attempt == 0 and not port_is_free(self.spec.host, wanted):
                continue
            self._launch()
            if self.wait_http_ok(f"{self.url}/health", self.startup_timeout_s):
                self._watch_rpc()
                return self
            text = self.log_text()
            if "couldn't bind" not in text and "address already in use" not in text.lower():
                break
        self.stop()
        raise ServerError(
            f"llama-server for {self.spec.model_path.name} did not become ready: {self.log_tail()}",
            f"full log in {self.log_path}",
        )

    def check_devices(self) -> None:
        """For a server split over RPC hosts or placing experts: every host answers, and there is
        a device besides the CPU to place experts away from (one line each, nothing started)."""
        spec = self.spec
        if not spec.rpc and not placement_args(spec.expert_placement):
            return
        devices = list_devices(self.toolchain, spec.rpc)
        check_placement([("server.expert_placement", spec.expert_placement)], devices)

    def _watch_rpc(self) -> None:
        if not self.spec.rpc:
            return
        self.rpc_watch = RpcWatch(self.spec.rpc, self.spec.rpc_lost_after_s, self._rpc_lost).start()
        if self.rpc_watch.unwatched:
            self._note(
                f"RPC hosts {', '.join(self.rpc_watch.unwatched)} have no `quantload rpc-server` status"
                " endpoint: if one is cut off, this server's requests time out instead of failing at once"
            )

    def alive(self) -> bool:
        """True while the process runs and no RPC host of it was lost (a lost one is being ended)."""
        return self.lost is None and super().alive()

    def _rpc_lost(self, reason: str) -> None:
        """A watched RPC host is lost: the server is stopped so its requests fail at once."""
        self.lost = reason
        self._note(f"{reason}; llama-server stopped, so its requests fail instead of hanging")
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()

    def _note(self, line: str) -> None:
        """A line of quantload's own in the server's log."""
        with self.log_path.open("a", encoding="utf-8") as log:
            log.write(f"quantload: {line}\n")

    def stop(self, timeout_s: float = 10.0) -> int | None:
        """Stop watching the RPC hosts, then the process (see LoggedProcess.stop)."""
        if self.rpc_watch is not None:
            self.rpc_watch.stop()
            self.rpc_watch = None
        return super().stop(timeout_s)

    def launch_only(self) -> LlamaServer:
        """Start the process on a free port without waiting for it to become ready."""
        self.port = self.spec.port or free_port(self.spec.host)
        self._launch()
        return self

    def wait_for_output(self, needle: str, timeout_s: float) -> bool:
        """Wait until the log contains `needle`; False if the process exits or time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if needle in self.log_text():
                return True
            if not self.alive():
                return needle in self.log_text()
            time.sleep(POLL_S / 2)
        return False

    def _launch(self) -> None:
        self.lost = None
        if self.spec.slot_save_path is not None:
            self.spec.slot_save_path.mkdir(parents=True, exist_ok=True)
        self.launch(
            self.spec.command(self.toolchain.path("llama-server"), self.port), self.spec.secret_env()
        )
        if self.spec.cpus and self.pid is not None:  # before it loads its model and starts its threads
            pin_process(self.pid, self.spec.cpus)

