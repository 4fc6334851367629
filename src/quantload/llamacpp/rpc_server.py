"""One ggml-rpc-server on this host, with a status endpoint beside it.

`ggml-rpc-server -H HOST -p PORT` (tools/rpc of the pinned llama.cpp, built with GGML_RPC=ON)
serves this host's CPU to a llama-server elsewhere (`--rpc HOST:PORT`); it serves one client at a
time and has no health check of its own. `quantload rpc-server` starts it and answers
`GET /status` on PORT + STATUS_PORT_OFFSET: 200 while it runs (with whether a llama-server is
connected), 503 once it has exited (with its exit code). The head host's llama-server is watched
through that endpoint (quantload.llamacpp.rpc_watch), because a connection to the RPC port itself
would wait behind the llama-server it serves.

After the rpc-server exits the status endpoint stays `linger_s` longer, so the head can say why
its host was lost, then `quantload rpc-server` exits with the rpc-server's own code.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from quantload.childproc import LoggedProcess
from quantload.errors import ServerError
from quantload.llamacpp.build import RPC_SERVER_TOOL
from quantload.llamacpp.toolchain import Toolchain

STATUS_PORT_OFFSET = 1
STATUS_PATH = "/status"
DEFAULT_RPC_PORT = 50052
TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
LISTEN_STATE = "0A"
CONNECTED_LINE = "Accepted client connection"
CLOSED_LINE = "Client connection closed"


def status_port(rpc_port: int) -> int:
    """The port the status endpoint of the rpc-server on `rpc_port` answers on."""
    return rpc_port + STATUS_PORT_OFFSET


@dataclass(frozen=True)
class RpcServerSpec:
    """How one ggml-rpc-server is started."""

    host: str = "127.0.0.1"
    port: int = DEFAULT_RPC_PORT
    threads: int = 0  # 0 = llama.cpp's default

    @property
    def endpoint(self) -> str:
        return f"{self.host}:{self.port}"

    def command(self, binary: Path) -> list[str]:
        args = [str(binary), "-H", self.host, "-p", str(self.port)]
        return args + (["-t", str(self.threads)] if self.threads else [])


class RpcServer(LoggedProcess):
    """A running ggml-rpc-server whose output goes to `log_path`."""

    def __init__(
        self, toolchain: Toolchain, spec: RpcServerSpec, log_path: Path, startup_timeout_s: float = 30.0
    ) -> None:
        super().__init__(log_path)
        self.toolchain = toolchain
        self.spec = spec
        self.startup_timeout_s = startup_timeout_s

    def start(self) -> RpcServer:
        """Launch it and wait until its port listens; ServerError (its own words) if it does not.

        Its port is watched in the kernel's TCP table, not connected to: a connection would be
        the one client it serves (and its startup lines are block-buffered until it exits)."""
        self.launch(self.spec.command(self.toolchain.path(RPC_SERVER_TOOL)))
        deadline = time.monotonic() + self.startup_timeout_s
        while self.alive() and time.monotonic() < deadline:
            if listening_on(self.spec.port, self.pid):
                return self
            time.sleep(0.05)
        why = self.log_tail() if not self.alive() else f"not listening after {self.startup_timeout_s:g} s"
        self.stop()
        raise ServerError(
            f"ggml-rpc-server on {self.spec.endpoint} did not start: {why}",
            f"is the port free and the address this host's? full log in {self.log_path}",
        )

    def client_connected(self) -> bool:
        """Whether a llama-server is connected now, as the rpc-server's own lines say."""
        text = self.launch_log_text()
        return text.rfind(CONNECTED_LINE) > text.rfind(CLOSED_LINE)

    def exit_code(self) -> int | None:
        """The exit code once it has exited; None while it runs."""
        process = self._process
        return None if process is None else process.poll()

    def status(self) -> dict[str, object]:
        """What the status endpoint answers."""
        code = self.exit_code()
        return {
            "endpoint": self.spec.endpoint,
            "rpc_server": "running" if code is None else "exited",
            "exit_code": code,
            "client": "connected" if code is None and self.client_connected() else "none",
            "pid": self.pid,
        }


def listening_on(port: int, pid: int | None = None, tables: tuple[Path, ...] = TCP_TABLES) -> bool:
    """Whether a socket of this network namespace listens on TCP `port` (the kernel's tables);
    with `pid`, a socket of that process (another listener on the port does not count)."""
    wanted = f"{port:04X}"
    owned = _socket_inodes(pid) if pid is not None else None
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10 or fields[3] != LISTEN_STATE or fields[1].rpartition(":")[2] != wanted:
                continue
            if owned is None or fields[9] in owned:
                return True
    return False


def _socket_inodes(pid: int) -> set[str]:
    """The inodes of the sockets process `pid` holds open."""
    found: set[str] = set()
    folder = Path(f"/proc/{pid}/fd")
    try:
        entries = list(folder.iterdir())
    except OSError:
        return found
    for entry in entries:
        try:
            target = os.readlink(entry)
        except OSError:
            continue
        if target.startswith("socket:["):
            found.add(target[len("socket:[") : -1])
    return found


def serve_status(server: RpcServer, host: str, port: int) -> ThreadingHTTPServer:
    """Answer GET /status about `server` on host:port, from a thread of its own (shut it down)."""
    status: Callable[[], dict[str, object]] = server.status

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path != STATUS_PATH:
                self.send_error(404)
                return
            answer = status()
            body = json.dumps(answer).encode()
            self.send_response(200 if answer["rpc_server"] == "running" else 503)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    http = ThreadingHTTPServer((host, port), Handler)
    http.daemon_threads = True
    threading.Thread(target=http.serve_forever, name="rpc-status", daemon=True).start()
    return http
