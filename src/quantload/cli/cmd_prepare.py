"""`quantload prepare`: F16, Q8_0 and Q4_K_M files of one model, with a manifest."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from quantload.cli.context import cli_context
from quantload.cli.progress_view import progress_bar
from quantload.llamacpp.toolchain import ensure_toolchain
from quantload.paths import cache_root, check_out_dir
from quantload.steps.prepare import prepare_model_files


def register(app: typer.Typer) -> None:
    """Add the `prepare` command."""

    @app.command("prepare")
    def prepare(
        ctx: typer.Context,
        model: str | None = typer.Option(
            None, "--model", help="qwen2.5-0.5b, smollm2-135m, tiny, or a local F16/BF16/F32 .gguf"
        ),
        out: Path = typer.Option(Path("models"), "--out", help="Folder for the files and manifest."),
    ) -> None:
        """Make the quantized files (llama-quantize) and DIR/manifest.json; reuses valid files."""
        cli = cli_context(ctx)
        settings = cli.config({"model.source": model}).settings
        check_out_dir(out)
        with progress_bar(cli.err_console, "llama.cpp build") as progress:
            toolchain = ensure_toolchain(settings.toolchain, cli.environ, progress)
        with progress_bar(cli.err_console, f"prepare {settings.model.source}") as progress:
            cache = cache_root(settings.toolchain.cache_dir, cli.environ)
            prepared = prepare_model_files(
                settings.model, settings.toolchain, toolchain, cache, cli.environ, out, progress
            )
        manifest = prepared.manifest
        table = Table("quant", "file", "size", "params", "seconds", title=f"{out / 'manifest.json'}")
        for entry in manifest.files.values():
            table.add_row(entry.quant, entry.file, f"{entry.size_bytes / 1e6:,.1f} MB",
                          f"{entry.n_params:,}", f"{entry.seconds:.1f}")
        cli.console.print(table)
        note = manifest.source.get("note")
        if note:
            cli.console.print(f"note: {note}", highlight=False)
