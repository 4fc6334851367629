"""`quantload quality`: perplexity of one or more GGUF files on the WikiText-2 test text."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.table import Table

from quantload.cli.context import cli_context
from quantload.cli.progress_view import progress_bar
from quantload.cli.result_labels import result_labels, source_notes
from quantload.llamacpp.toolchain import ensure_toolchain
from quantload.models.gguf_meta import check_is_gguf, read_gguf
from quantload.paths import cache_root, check_out_file
from quantload.quality.results import QualityFile, load_quality_file
from quantload.steps.quality import measure_file_quality, quality_text


def quality_table(results: QualityFile) -> Table:
    """One row per file: perplexity +/- error and the settings it rests on (files listed apart)."""
    table = Table(title="Perplexity on WikiText-2 test (lower is better)")
    for header in ("quant", "perplexity", "+/-", "ctx", "chunks", "tokens scored", "seconds"):
        table.add_column(header, no_wrap=True, justify="left" if header == "quant" else "right")
    for label, result in results.results.items():
        table.add_row(
            label,
            f"{result.perplexity:,.4f}",
            f"{result.perplexity_error:,.4f}",
            str(result.ctx_tokens),
            str(result.chunks_scored),
            f"{result.tokens_scored:,}",
            f"{result.wall_time_s:.1f}",
        )
    return table


def register(app: typer.Typer) -> None:
    """Add the `quality` command."""

    @app.command("quality")
    def quality(
        ctx: typer.Context,
        models: list[Path] = typer.Argument(..., help="One or more .gguf files.", metavar="MODEL"),
        dataset: Path | None = typer.Option(
            None, "--dataset", help="WikiText-2 wiki.test.raw (default: downloaded once, cached)."
        ),
        context_tokens: int | None = typer.Option(None, "--ctx", help="Tokens per chunk [512]."),
        chunks: int | None = typer.Option(None, "--chunks", help="Chunks to score [0 = all]."),
        threads: int | None = typer.Option(None, "--threads", help="Threads [0 = default]."),
        as_json: bool = typer.Option(False, "--json", help="Print the quality.json object."),
        out: Path | None = typer.Option(
            None, "--out", help="Add the results to this quality.json (created if absent)."
        ),
    ) -> None:
        """Measure perplexity with llama-perplexity; F16 < Q8_0 < Q4_K_M is the usual order."""
        cli = cli_context(ctx)
        settings = cli.config(
            {
                "quality.dataset": dataset,
                "quality.ctx": context_tokens,
                "quality.chunks": chunks,
                "quality.threads": threads,
            }
        ).settings
        if out is not None and check_out_file(out).exists():
            load_quality_file(out)  # a file that is not a quality.json is refused before measuring
        for model in models:
            check_is_gguf(model)
        labels = result_labels(models, [read_gguf(model).file_type for model in models])
        cache = cache_root(settings.toolchain.cache_dir, cli.environ)
        text = quality_text(settings.quality, cache, cli.environ)
        with progress_bar(cli.err_console, "llama.cpp build") as progress:
            toolchain = ensure_toolchain(settings.toolchain, cli.environ, progress)
        results = QualityFile()
        for model, label in zip(models, labels, strict=True):
            with progress_bar(cli.err_console, f"perplexity {model.name}") as progress:
                result = measure_file_quality(
                    toolchain, model, text, settings.quality, label, progress, out
                )
            results = results.with_result(label, result)
        if as_json:
            typer.echo(json.dumps(results.to_json(), indent=2))
            return
        cli.console.print(quality_table(results))
        for source_note in source_notes(models):
            cli.console.print(f"note: {source_note}", highlight=False)
        for label, result in results.results.items():
            cli.console.print(f"{label}: {result.model_path}", highlight=False)
        cli.console.print(
            f"text: {text} (sha256 {next(iter(results.results.values())).dataset.sha256[:12]});"
            f" llama.cpp: {toolchain.label}" + (f"; written to {out}" if out else ""),
            highlight=False,
        )
