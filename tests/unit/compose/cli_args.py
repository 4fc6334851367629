"""Checking a `quantload ...` argument list against the real CLI, without running the command.

typer (0.29) carries its own copy of click as `typer._click`; the command objects and the errors
they raise come from there, so the error classes are taken from it too.
"""

from __future__ import annotations

from typing import Any

import typer.main
from typer._click.exceptions import BadParameter, UsageError

from quantload.cli.main import build_app

__all__ = ["BadParameter", "UsageError", "check_quantload_argv", "subcommands"]


def subcommands() -> dict[str, Any]:
    """Every `quantload` subcommand by name, as typer registered it."""
    group = typer.main.get_command(build_app())
    commands: dict[str, Any] = getattr(group, "commands")  # noqa: B009 (a group's table of commands)
    return commands


def check_quantload_argv(argv: list[str]) -> dict[str, object]:
    """Parse `argv` (starting with "quantload") as the CLI would; return the parsed parameters.

    Raises UsageError for an unknown subcommand or option, BadParameter for a bad value.
    """
    assert argv[:1] == ["quantload"], f"not a quantload command: {argv}"
    name, *args = argv[1:]
    command = subcommands().get(name)
    if command is None:
        raise UsageError(f"no such quantload subcommand: {name}")
    context = command.make_context(name, list(args))
    return dict(context.params)
