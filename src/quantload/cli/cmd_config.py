"""`quantload config show`: the resolved configuration and where each value came from."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from quantload.cli.context import cli_context
from quantload.config import describe


def register(app: typer.Typer) -> None:
    """Add the `config` command group."""
    group = typer.Typer(help="Inspect the configuration.", no_args_is_help=True)

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

    app.add_typer(group, name="config")
