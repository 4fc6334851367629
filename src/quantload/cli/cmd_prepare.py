"""`quantload prepare`: the files of one model (any llama-quantize type, custom mixes, an
importance matrix), or the user's own files, with a manifest."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from quantload.analysis.run_tables import imatrix_text
from quantload.cli.context import cli_context
from quantload.cli.file_args import given_files, quant_labels
from quantload.cli.progress_view import progress_bar
from quantload.llamacpp.toolchain import ensure_toolchain
from quantload.models.manifest import ManifestEntry
from quantload.models.prepared import preflight, prepare_model_files, scored_text_on_disk
from quantload.paths import cache_root, check_out_dir


def params_text(entry: ManifestEntry) -> str:
    """Parameters in millions, and a mixture of experts' active ones beside them."""
    total = f"{entry.n_params / 1e6:,.1f} M"
    if not entry.moe:
        return total
    experts = f"{entry.moe['expert_used_count']} of {entry.moe['expert_count']} experts"
    return f"{total} ({entry.moe['active_params'] / 1e6:,.1f} M active: {experts})"


def register(app: typer.Typer) -> None:
    """Add the `prepare` command."""

    @app.command("prepare")
    def prepare(
        ctx: typer.Context,
        model: str | None = typer.Option(
            None, "--model", help="qwen2.5-0.5b, smollm2-135m, tiny, tiny-moe, or a local F16/BF16/F32 .gguf"
        ),
        out: Path = typer.Option(Path("models"), "--out", help="Folder for the files and manifest."),
        quants: str | None = typer.Option(
            None, "--quants", help="llama-quantize types, comma-separated; TYPE-imatrix with the matrix."
        ),
        imatrix: str | None = typer.Option(None, "--imatrix", help="off, computed, or an imatrix file."),
        calibration: str | None = typer.Option(
            None, "--calibration", help="The imatrix's text: wikitext-2-train (default) or a file."
        ),
        files: list[str] | None = typer.Option(
            None, "--files", help="GGUF files, a folder or hf:OWNER/REPO[:GLOB], taken as they are."
        ),
        reference: Path | None = typer.Option(None, "--reference", help="With --files: the F16/BF16/F32."),
        more_files: list[str] | None = typer.Argument(None, hidden=True, metavar="[FILE]..."),
    ) -> None:
        """Make the files (llama-quantize, llama-imatrix) and DIR/manifest.json; reuses valid files."""
        cli = cli_context(ctx)
        chosen = given_files(files, more_files)
        settings = cli.config(
            {
                "model.source": model,
                "prepare.quants": quant_labels(quants),
                "prepare.imatrix": imatrix,
                "prepare.calibration": calibration,
                "prepare.files": tuple(chosen) if chosen else None,
                "prepare.reference": reference,
            }
        ).settings
        check_out_dir(out)
        cache = cache_root(settings.toolchain.cache_dir, cli.environ)
        preflight(settings.prepare, settings.quality, cache)
        with progress_bar(cli.err_console, "llama.cpp build") as progress:
            toolchain = ensure_toolchain(
                settings.toolchain, cli.environ, progress, gpu_layers=settings.server.gpu_layers
            )
        title = "the given files" if settings.prepare.files else settings.model.source
        with progress_bar(cli.err_console, f"prepare {title}") as progress:
            prepared = prepare_model_files(
                settings.model, settings.toolchain, toolchain, cache, cli.environ, out, progress,
                prepare=settings.prepare, scored_text=scored_text_on_disk(settings.quality, cache),
            )  # fmt: skip
        manifest = prepared.manifest
        table = Table(
            "file", "type", "size", "params", "imatrix", "made from", "seconds",
            title=f"{out / 'manifest.json'}",
        )  # fmt: skip
        for label in manifest.ordered_labels():
            entry = manifest.files[label]
            mark = " (reference)" if label == manifest.reference_label() else ""
            table.add_row(
                label + mark, entry.file_type, f"{entry.size_bytes / 1e6:,.1f} MB", params_text(entry),
                imatrix_text(entry.imatrix),
                entry.recipe or entry.origin or entry.made_from, f"{entry.seconds:.1f}",
            )  # fmt: skip
        cli.console.print(table)
        if manifest.imatrix:
            record = manifest.imatrix
            how = "reused from the cache" if record.get("reused") else f"{record.get('seconds')} s"
            line = f"importance matrix: {record.get('path')} ({record.get('mode')}, {how})"
            cli.console.print(line, highlight=False)
        note = manifest.source.get("note")
        if note:
            cli.console.print(f"note: {note}", highlight=False)
