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
from quantload.exporter.targets import secret_options, targets_from_specs

TARGET_HELP = (
    "A llama-server to read: NAME=URL, optionally followed by ,quant=Q ,model=M ,api_key_env=VAR "
    "(the environment variable holding its key) ,kv_cells=N ,log=PATH. Without quant/model they "
    "are read from the server's /props. Repeat. (,api_key=K still works, but `ps` shows it.)"
)
KEY_IN_PS_WARNING = (
    "warning: exporter target {name}: api_key= on the command line is shown to every user by `ps`;"
    " use api_key_env=VAR (an environment variable holding the key) or --api-key-env VAR"
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
        api_key_env: str | None = typer.Option(
            None,
            "--api-key-env",
            help="Environment variable holding the key of every target without its own"
            " (default: server.api_key, e.g. QUANTLOAD_SERVER__API_KEY).",
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
        if api_key_env is not None:
            api_key = cli.environ.get(api_key_env)
            if not api_key:
                raise ConfigError(
                    f"environment variable {api_key_env} is empty or unset",
                    f"export {api_key_env}=<the servers' key>",
                )
        targets = targets_from_specs(observe.exporter_targets, api_key, cli.environ)
        for spec in target or []:
            if secret_options(spec):
                name = spec.partition("=")[0].strip()
                cli.err_console.print(KEY_IN_PS_WARNING.format(name=name), highlight=False, soft_wrap=True)
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
