"""The list of subcommand registrars; each subcommand module exposes `register(app)`."""

from __future__ import annotations

from collections.abc import Callable

import typer

from quantload.cli import (
    cmd_calibrate,
    cmd_config,
    cmd_exporter,
    cmd_kv,
    cmd_load,
    cmd_load_worker,
    cmd_prepare,
    cmd_quality,
    cmd_report,
    cmd_rpc_server,
    cmd_run,
    cmd_speed,
    cmd_stack,
    cmd_toolchain,
    cmd_tune,
)

REGISTRARS: tuple[Callable[[typer.Typer], None], ...] = (
    cmd_config.register,
    cmd_toolchain.register,
    cmd_exporter.register,
    cmd_prepare.register,
    cmd_kv.register,
    cmd_run.register,
    cmd_rpc_server.register,
    cmd_quality.register,
    cmd_speed.register,
    cmd_load.register,
    cmd_load_worker.register,
    cmd_calibrate.register,
    cmd_report.register,
    cmd_stack.register,
    cmd_tune.register,
)
