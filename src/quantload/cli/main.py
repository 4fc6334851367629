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

INTERRUPTED_EXIT_CODE = 130  # the shell's code for a process ended by SIGINT


def _print_version(value: bool) -> None:
    """Eager --version: print and stop before a subcommand is asked for."""
    if value:
        typer.echo(f"quantload {__version__}")
        raise typer.Exit()


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
        version: Annotated[
            bool,
            typer.Option("--version", help="Print the version.", is_eager=True, callback=_print_version),
        ] = False,
    ) -> None:
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
        # Without standalone mode, typer turns `typer.Exit(n)` and Ctrl-C (130) into a return value.
        exit_code = app(args=argv, standalone_mode=False)
    except QuantloadError as error:
        message = Text("error: ", style="bold red") + Text(error.one_line())
        Console(stderr=True, highlight=False, soft_wrap=True).print(message)
        return 2
    except KeyboardInterrupt:
        Console(stderr=True).print("interrupted")
        return INTERRUPTED_EXIT_CODE
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
    if exit_code == INTERRUPTED_EXIT_CODE:
        Console(stderr=True).print("interrupted")
    return exit_code if isinstance(exit_code, int) else 0


if __name__ == "__main__":
    sys.exit(main())
