"""`quantload exporter`: serve Prometheus metrics for a fixed set of llama-servers."""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType
from typing import Annotated

import typer

from quantload.cli.context import cli_context
from quantload.errors import ConfigError
from quantload.exporter import start_exporter
from quantload.exporter.targets import targets_from_specs

TARGET_HELP = (
    "A llama-server to read: NAME=URL, optionally followed by ,quant=Q ,model=M ,api_key=K "
    ",kv_cells=N ,log=PATH. Without quant/model they are read from the server's /props. Repeat."
)


def _log_to_stderr() -> None:
    logger = logging.getLogger("quantload")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)


def _wait_for_stop() -> None:
    """Block until Ctrl-C or SIGTERM."""
    stop = threading.Event()

    def on_term(signum: int, frame: FrameType | None) -> None:
        stop.set()

    previous = signal.signal(signal.SIGTERM, on_term)
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        signal.signal(signal.SIGTERM, previous)


def register(app: typer.Typer) -> None:
    """Add the `exporter` command."""

    @app.command("exporter")
    def exporter(
        ctx: typer.Context,
        target: Annotated[list[str] | None, typer.Option("--target", help=TARGET_HELP)] = None,
        port: int | None = typer.Option(None, "--port", help="Port to serve on (default 9646)."),
        host: str | None = typer.Option(None, "--host", help="Address to bind (default loopback)."),
        timeout_s: float | None = typer.Option(
            None, "--timeout", help="Seconds a scrape waits for the servers (default 0.5)."
        ),
    ) -> None:
        """Serve llama-servers' metrics, slot usage and KV occupancy at /metrics.

        The exporter must be the only reader of each server's /metrics (llama-server resets its
        throughput gauges on every read): point Prometheus at the exporter, never at the servers.
        """
        cli = cli_context(ctx)
        settings = cli.config(
            {
                "observe.exporter_targets": tuple(target) if target else None,
                "observe.exporter_port": port,
                "observe.exporter_host": host,
                "observe.exporter_timeout_s": timeout_s,
            }
        ).settings
        observe = settings.observe
        api_key = settings.server.api_key.get_secret_value() if settings.server.api_key else None
        targets = targets_from_specs(observe.exporter_targets, api_key)
        if not targets:
            raise ConfigError(
                "the exporter has no targets",
                "give --target NAME=URL (repeatable) or set observe.exporter_targets",
            )
        _log_to_stderr()
        handle = start_exporter(
            targets, observe.exporter_port, observe.exporter_timeout_s, observe.exporter_host
        )
        names = ", ".join(f"{t.name}={t.url}" for t in targets)
        cli.err_console.print(
            f"exporter serving {handle.url}/metrics for {names}", highlight=False, soft_wrap=True
        )
        try:
            _wait_for_stop()
        finally:
            handle.stop()
