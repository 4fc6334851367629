"""Entry point of the `quantload` command."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from quantload import __version__
from quantload.cli import commands
from quantload.cli.context import CliContext
from quantload.errors import QuantloadError


def build_app() -> typer.Typer:
    """The typer application with every subcommand registered."""
    app = typer.Typer(
        name="quantload",
        help="Measure llama.cpp quantizations (quality, speed, KV cache, streaming load) and "
        "report which one to serve.",
        no_args_is_help=True,
        pretty_exceptions_enable=False,
        add_completion=False,
    )

    @app.callback()
    def root(
        ctx: typer.Context,
        config_file: Annotated[
            Path | None, typer.Option("--config", help="Configuration file (default ./quantload.toml).")
        ] = None,
        version: Annotated[bool, typer.Option("--version", help="Print the version.")] = False,
    ) -> None:
        if version:
            typer.echo(f"quantload {__version__}")
            raise typer.Exit()
        ctx.obj = CliContext(
            cwd=Path.cwd(),
            environ=dict(os.environ),
            config_file=config_file,
            console=Console(),
            err_console=Console(stderr=True),
        )

    for register in commands.REGISTRARS:
        register(app)
    return app


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; a QuantloadError becomes one line on stderr and exit code 2."""
    app = build_app()
    try:
        app(args=argv, standalone_mode=False)
    except QuantloadError as error:
        message = Text("error: ", style="bold red") + Text(error.one_line())
        Console(stderr=True, highlight=False, soft_wrap=True).print(message)
        return 2
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted")
        return 130
    except typer.Exit as done:
        return int(done.exit_code or 0)
    except typer.Abort:
        return 1
    except Exception as error:
        exit_code = getattr(error, "exit_code", None)
        show = getattr(error, "show", None)
        if exit_code is not None and callable(show):
            show()
            return int(exit_code)
        raise
    return 0


if __name__ == "__main__":
    sys.exit(main())
