"""`quantload config show`: the resolved configuration and where each value came from;
`quantload config prometheus`: a Prometheus configuration for parts that run on other hosts."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from quantload.cli.context import cli_context
from quantload.config import describe
from quantload.errors import ConfigError
from quantload.observe.prometheus import (
    EXPORTER_JOB,
    LOADGEN_JOB,
    SELF_JOB,
    PrometheusError,
    prometheus_duration,
    scrape_address,
    write_prometheus_config,
)
from quantload.paths import check_out_dir
from quantload.urls import BadUrl, HostPort, host_port


def _addresses(values: list[str], option: str) -> list[str]:
    try:
        return [scrape_address(value) for value in values]
    except PrometheusError as error:
        raise ConfigError(f"{option}: {error.problem}", "give HOST:PORT, e.g. 10.0.0.5:9646") from None


def _listen(value: str) -> tuple[str, str]:
    """--listen as Prometheus' --web.listen-address, and the target it scrapes itself at."""
    try:
        address = host_port(value)
    except BadUrl as error:
        raise ConfigError(f"--listen: {error}", "give HOST:PORT, e.g. 0.0.0.0:9090") from None
    itself = HostPort("::1" if address.host == "::" else "127.0.0.1", address.port)
    return address.address, (itself if address.unspecified else address).address


def register(app: typer.Typer) -> None:
    """Add the `config` command group."""
    group = typer.Typer(
        help="Inspect the configuration; write Prometheus' for parts on other hosts.", no_args_is_help=True
    )

    @group.command("show")
    def show(
        ctx: typer.Context,
        as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
    ) -> None:
        """Print every setting, its value and its source (default, profile, file, env, flag)."""
        cli = cli_context(ctx)
        rows = describe(cli.config())
        if as_json:
            data = {key: {"value": json.loads(value), "source": source} for key, value, source in rows}
            typer.echo(json.dumps(data, indent=2))
            return
        table = Table("key", "value", "source", title="quantload configuration")
        for key, value, source in rows:
            table.add_row(key, value, source)
        cli.console.print(table)

    @group.command("prometheus")
    def prometheus(
        ctx: typer.Context,
        out: Path = typer.Option(..., "--out", help="Folder for prometheus.yml and rules/."),
        exporter: list[str] = typer.Option(
            [], "--exporter", help="HOST:PORT of a `quantload exporter`; repeat for several."
        ),
        loadgen: list[str] = typer.Option(
            [], "--loadgen", help="HOST:PORT of a load process's /metrics (the master of `quantload"
            " load`, each `quantload load-worker`); repeat for each."
        ),
        listen: str = typer.Option(
            "127.0.0.1:9090", "--listen", help="HOST:PORT this Prometheus will listen on (it scrapes itself)."
        ),
        scrape_interval: float | None = typer.Option(
            None, "--scrape-interval", help="Seconds between scrapes (default: observe.scrape_interval_s)."
        ),
    ) -> None:
        """Write the repository's prometheus.yml and rules with these scrape targets, for a
        Prometheus that watches an exporter and load processes on other hosts."""
        cli = cli_context(ctx)
        settings = cli.config().settings
        if not exporter and not loadgen:
            raise ConfigError("no scrape targets", "give --exporter HOST:PORT and/or --loadgen HOST:PORT")
        listen_address, itself = _listen(listen)
        addresses = {
            SELF_JOB: [itself],
            EXPORTER_JOB: _addresses(exporter, "--exporter"),
            LOADGEN_JOB: _addresses(loadgen, "--loadgen"),
        }
        interval = scrape_interval if scrape_interval is not None else settings.observe.scrape_interval_s
        try:
            prometheus_duration(interval)
        except PrometheusError as error:
            raise ConfigError(f"--scrape-interval: {error.problem}", "e.g. --scrape-interval 1") from None
        check_out_dir(out)
        try:
            path = write_prometheus_config(out, addresses, interval)
        except PrometheusError as error:
            raise ConfigError(error.problem, error.hint) from None
        cli.console.print(f"wrote {path}", highlight=False, soft_wrap=True)
        cli.console.print(
            f"run: prometheus --config.file={path} --web.listen-address={listen_address}"
            " --storage.tsdb.path=<data folder>",
            highlight=False,
            soft_wrap=True,
        )

    app.add_typer(group, name="config")
