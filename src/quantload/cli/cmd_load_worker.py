"""`quantload load-worker`: a load host's Locust worker, joining every plan of a remote master."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any

import typer

from quantload.cli.context import cli_context
from quantload.errors import ConfigError
from quantload.load.processes import master_listen_port
from quantload.load.remote_worker import WorkerLoop, worker_argv
from quantload.urls import host_problem

LOG_NAME = "load-worker.log"


def register(app: typer.Typer) -> None:
    """Add the `load-worker` command."""

    @app.command("load-worker")
    def load_worker(
        ctx: typer.Context,
        master_host: Annotated[
            str, typer.Option(help="Address of the host running `quantload load --remote-workers N`.")
        ],
        master_port: Annotated[
            int | None, typer.Option(min=1, max=65535, help="The master's load.master_port [Locust's 5557].")
        ] = None,
        metrics_host: Annotated[
            str | None, typer.Option(help="Address to serve /metrics on (this host's, for Prometheus).")
        ] = None,
        metrics_port: Annotated[int | None, typer.Option(help="/metrics port; 0 = none.")] = None,
        plans: Annotated[
            int, typer.Option(min=0, help="Stop after this many plans; 0 = until stopped.")
        ] = 0,
        log: Annotated[
            Path | None, typer.Option(help=f"Log of every worker process (default <run.out>/{LOG_NAME}).")
        ] = None,
        api_key_env: Annotated[
            str | None, typer.Option(help="Environment variable holding the servers' API key.")
        ] = None,
    ) -> None:
        """Send a remote master's requests from this host: one Locust worker per plan, until stopped.

        `quantload load` starts a new master for every experiment at every server; this joins
        each in turn at --master-host:--master-port. Its request metrics are served on
        --metrics-host:--metrics-port for Prometheus; its records go to the master.
        """
        cli = cli_context(ctx)
        flags: dict[str, Any] = {"load.metrics_host": metrics_host, "load.metrics_port": metrics_port}
        settings = cli.config(flags).settings
        if not master_host.strip():
            raise ConfigError("--master-host is empty", "give the address of the host running quantload load")
        if (problem := host_problem(master_host)) is not None:
            raise ConfigError(f"--master-host: {problem}", "give the master host's address")
        api_key = settings.server.api_key.get_secret_value() if settings.server.api_key else None
        if api_key_env is not None:
            api_key = cli.environ.get(api_key_env) or os.environ.get(api_key_env)
            if not api_key:
                raise ConfigError(f"environment variable {api_key_env} is empty or unset")
        log_path = log if log is not None else settings.run.out / LOG_NAME
        if log_path.is_dir():
            raise ConfigError(f"--log {log_path} is a folder", "give a file path")
        load = settings.load
        port = master_listen_port(master_host, master_port or 0, remote_workers=1)
        argv = worker_argv(master_host, port, load.metrics_host, load.metrics_port)
        where = f"/metrics on {load.metrics_host}:{load.metrics_port}" if load.metrics_port else "no /metrics"
        cli.err_console.print(
            f"load worker: joining the master at {master_host}:{port}, {where}, log {log_path}",
            highlight=False,
            soft_wrap=True,
        )

        def say(line: str) -> None:
            cli.err_console.print(f"load worker: {line}", highlight=False, soft_wrap=True)

        WorkerLoop(argv, log_path, api_key, plans, say, environ=cli.environ).run()
