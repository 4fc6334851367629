"""What every subcommand receives: the resolved configuration and the console."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer
from rich.console import Console

if TYPE_CHECKING:
    from quantload.config import ResolvedConfig


@dataclass(frozen=True)
class CliContext:
    """Built once by the top-level callback and handed to each subcommand."""

    cwd: Path
    environ: Mapping[str, str]
    config_file: Path | None
    console: Console
    err_console: Console

    def config(self, flags: Mapping[str, Any] | None = None) -> ResolvedConfig:
        """The configuration with this subcommand's flags as the top layer."""
        from quantload.config import load_config  # pydantic's models: not for `quantload --help`
        from quantload.experiments.registry import requested_names

        config = load_config(self.cwd, self.environ, flags, self.config_file)
        requested_names(config.settings)  # the experiments' names, checked before any work
        return config


def cli_context(ctx: typer.Context) -> CliContext:
    """The CliContext stored on the typer context by the top-level callback."""
    obj = ctx.find_root().obj
    if not isinstance(obj, CliContext):
        obj = CliContext(
            Path.cwd(), dict(os.environ), None, Console(markup=False), Console(stderr=True, markup=False)
        )
    return obj
