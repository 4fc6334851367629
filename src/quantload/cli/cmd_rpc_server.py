"""`quantload rpc-server`: serve this host's CPU to a llama-server that is split over hosts."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from types import FrameType

import typer

from quantload.cli.context import cli_context
from quantload.cli.progress_view import progress_bar
from quantload.errors import ConfigError
from quantload.llamacpp.build import RPC_SERVER_TOOL
from quantload.llamacpp.rpc_server import (
    DEFAULT_RPC_PORT,
    STATUS_PATH,
    RpcServer,
    RpcServerSpec,
    serve_status,
    status_port,
)
from quantload.llamacpp.toolchain import ensure_toolchain

POLL_S = 0.2


def _stop_event() -> threading.Event:
    """Set on SIGTERM (Ctrl-C arrives as KeyboardInterrupt)."""
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_term)
    return stop


def register(app: typer.Typer) -> None:
    """Add the `rpc-server` command."""

    @app.command("rpc-server")
    def rpc_server(
        ctx: typer.Context,
        host: str = typer.Option("127.0.0.1", "--host", help="This host's address to serve on."),
        port: int = typer.Option(DEFAULT_RPC_PORT, "--port", help="The RPC port (status on the next one)."),
        threads: int = typer.Option(0, "--threads", help="CPU threads; 0 = llama.cpp's default."),
        log: Path = typer.Option(Path("rpc-server.log"), "--log", help="Where its output goes."),
        linger_s: float = typer.Option(
            30.0, "--linger", help="Seconds the status says 'exited' after the rpc-server exits."
        ),
    ) -> None:
        """Run ggml-rpc-server on this host, for a llama-server elsewhere started with server.rpc.

        Its status (running or exited, a llama-server connected or not) answers at
        http://HOST:PORT+1/status, which the head host watches: a host that is lost stops the
        llama-server, so its requests fail instead of hanging. The RPC port is unauthenticated and
        unencrypted: serve it only on a network of your own hosts.
        """
        cli = cli_context(ctx)
        if not 0 < port < 65535:
            raise ConfigError(f"--port {port} leaves no port for the status endpoint", "use 1-65534")
        if threads < 0 or linger_s < 0:
            raise ConfigError("--threads and --linger cannot be negative", "give 0 or more")
        settings = cli.config().settings.toolchain
        with progress_bar(cli.err_console, "llama.cpp build") as progress:
            toolchain = ensure_toolchain(settings, cli.environ, progress)
        toolchain.path(RPC_SERVER_TOOL)  # one line when this llama.cpp has none
        stop = _stop_event()
        server = RpcServer(toolchain, RpcServerSpec(host, port, threads), log)
        server.start()
        try:
            status = serve_status(server, host, status_port(port))
        except OSError as error:
            server.stop()
            raise ConfigError(
                f"the status endpoint cannot listen on {host}:{status_port(port)}: {error.strerror}",
                "free that port, or pick another --port",
            ) from None
        cli.err_console.print(
            f"rpc-server serving {host}:{port} (status http://{host}:{status_port(port)}{STATUS_PATH},"
            f" log {log})",
            highlight=False, soft_wrap=True,
        )  # fmt: skip
        code = 0
        try:
            while not stop.wait(POLL_S):
                exited = server.exit_code()
                if exited is not None:
                    cli.err_console.print(
                        f"rpc-server on {host}:{port} exited (code {exited}): {server.log_tail()}",
                        highlight=False, soft_wrap=True,
                    )  # fmt: skip
                    stop.wait(linger_s)  # the status says why meanwhile
                    code = 1  # it serves until stopped: any exit of its own is a failure
                    break
        except KeyboardInterrupt:
            pass
        finally:
            status.shutdown()
            server.stop()
        if code:
            raise typer.Exit(code)
