"""`quantload quality`: perplexity of GGUF files on WikiText-2, and their KL divergence from F16."""

from __future__ import annotations

import functools
import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import typer
from rich import box
from rich.console import Console
from rich.table import Table

from quantload.cli.context import CliContext, cli_context
from quantload.cli.progress_view import progress_bar
from quantload.cli.result_labels import result_labels, source_notes
from quantload.config import Settings
from quantload.errors import ConfigError, MeasurementError, QuantloadError
from quantload.llamacpp.kld_base import format_bytes
from quantload.llamacpp.quant_types import REFERENCE_TYPES, quant_types
from quantload.llamacpp.toolchain import ensure_toolchain
from quantload.models.file_plan import IMATRIX_SUFFIX
from quantload.models.gguf_meta import check_is_gguf, read_gguf
from quantload.models.imatrix_file import imatrix_metadata
from quantload.models.manifest import source_note_of
from quantload.paths import cache_root, check_out_dir, check_out_file
from quantload.progress import ProgressCallback
from quantload.quality.dataset import resolve_dataset
from quantload.quality.kld_measure import KldFile, RunAttempt, find_reference, measure_kld_set
from quantload.quality.kld_results import FLOOR_CACHE_TYPE, KldSet
from quantload.quality.measure import measure_file_quality
from quantload.quality.results import QualityFile, load_quality_file
from quantload.quality.sensitivity import SensitivityFile, scan_sensitivity
from quantload.rundir.handle import RunDir

T = TypeVar("T")


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


def _plus_minus(value: float, error: float | None, digits: int) -> str:
    return f"{value:.{digits}f}" + ("" if error is None else f" ± {error:.{digits}f}")


def _table(title: str, headers: tuple[str, ...], left: int) -> Table:
    table = Table(title=title, box=box.SIMPLE_HEAD, pad_edge=False)
    for index, header in enumerate(headers):
        table.add_column(header, no_wrap=True, justify="left" if index < left else "right")
    return table


def kld_table(kld: KldSet) -> Table:
    """One row per file, f16 KV cache: mean KLD, its tail, same top token and Δppl (the rest of
    llama-perplexity's statistics are in quality.json)."""
    table = _table(
        "KL divergence from F16 (nats; lower is better)",
        ("quant", "mean KLD", "p99.9 KLD", "same top %", "Δppl %"),
        left=1,
    )
    for label, result in kld.for_cache_type(FLOOR_CACHE_TYPE).items():
        table.add_row(
            label + (" (floor)" if result.is_floor else ""),
            _plus_minus(result.kld_mean_nats, result.kld_mean_error_nats, 5),
            f"{result.kld_p99_9_nats:.4f}",
            f"{result.same_top_p_pct:.2f}",
            _plus_minus(result.ppl_change_pct, result.ppl_change_error_pct, 2),
        )
    return table


def kv_table(kld: KldSet) -> Table:
    """One row per file and KV-cache type: what the cache type adds to the weights' loss."""
    table = _table(
        "KL divergence from F16 per KV cache type (-ctk/-ctv)",
        ("quant", "KV", "mean KLD", "same top %", "Δppl %", "seconds"),
        left=2,
    )
    for label, per_type in kld.results.items():
        for cache_type, result in per_type.items():
            table.add_row(
                label,
                cache_type,
                _plus_minus(result.kld_mean_nats, result.kld_mean_error_nats, 5),
                f"{result.same_top_p_pct:.2f}",
                _plus_minus(result.ppl_change_pct, result.ppl_change_error_pct, 2),
                f"{result.wall_time_s:.1f}",
            )
    return table


def kld_summary_line(kld: KldSet) -> str:
    """Where the KLDs come from: the reference, its chunks, the base file and its fate."""
    base = kld.base
    fate = "reused from the cache" if base.reused else ("kept" if base.kept else "removed after use")
    return (
        f"KLD reference: {base.model_path} ({base.chunks_scored} chunks of {base.ctx_tokens} tokens,"
        f" {base.tokens_scored:,} tokens scored); base logits {format_bytes(base.file_size_bytes)}"
        f" ({fate}, {base.wall_time_s:.1f} s to write); KLD in nats"
    )


def _with_progress_bar(console: Console, failures: list[str]) -> RunAttempt:
    """Each llama-perplexity run under its own progress bar; a failed run is said at once and
    kept in `failures`, and the next run goes on (as `quantload run` does it)."""

    def attempt(title: str, label: str | None, body: Callable[[ProgressCallback], T]) -> T | None:
        try:
            with progress_bar(console, title) as progress:
                return body(progress)
        except QuantloadError as error:
            failures.append(f"{title}: {error.one_line()}")
            console.print(f"error: {title}: {error.one_line()}", highlight=False, soft_wrap=True)
            return None

    return attempt


def scan_table(scan: SensitivityFile) -> Table:
    """The scan's variants, best first in each direction."""
    table = _table(
        f"Sensitivity from {scan.base_type} ({scan.chunks_scored} chunks; KLD in nats)",
        ("variant", "size MiB", "mean KLD", "Δ KLD", "Δ MiB", "KLD per MiB", "seconds"),
        left=1,
    )
    rows = [scan.base] if scan.base else []
    rows += scan.ranking("raise") + scan.ranking("lower") + ([scan.mix] if scan.mix else [])
    for v in rows:
        if v is None:
            continue
        table.add_row(
            v.name, f"{v.size_bytes / 2**20:.2f}", _plus_minus(v.kld_mean_nats, v.kld_mean_error_nats, 5),
            "" if v.kld_change_nats is None else f"{v.kld_change_nats:+.5f}",
            "" if v.size_change_mib is None else f"{v.size_change_mib:+.2f}",
            "" if v.kld_per_mib is None else f"{v.kld_per_mib:.5f}", f"{v.seconds:.1f}",
        )  # fmt: skip
    return table


def _scan(cli: CliContext, settings: Settings, models: list[Path], out: Path) -> None:
    """`quality --sensitivity`: the scan of the one reference file given."""
    if len(models) != 1:
        raise ConfigError(
            "quality --sensitivity takes one MODEL: the F16, BF16 or F32 reference", "e.g. F16.gguf"
        )
    reference = models[0]
    kind = read_gguf(reference).file_type
    if kind not in REFERENCE_TYPES:
        raise ConfigError(
            f"{reference} is {kind}; the scan starts from an F16, BF16 or F32 file", "give the reference"
        )
    out = check_out_dir(out)
    cache = cache_root(settings.toolchain.cache_dir, cli.environ)
    with progress_bar(cli.err_console, "llama.cpp build") as progress:
        toolchain = ensure_toolchain(
            settings.toolchain, cli.environ, progress, gpu_layers=settings.server.gpu_layers
        )
    types = quant_types(toolchain)
    types.file_type(settings.sensitivity.base, "sensitivity.base (--base)")  # a typo fails before work
    text = resolve_dataset(settings.quality.dataset, cache, cli.environ)
    with progress_bar(cli.err_console, "sensitivity scan") as progress:
        scan = scan_sensitivity(
            toolchain, reference, text, cache, settings.quality, settings.sensitivity,
            settings.report.max_kld_mean_nats, types, out, progress,
        )  # fmt: skip
    cli.console.print(scan_table(scan))
    proposal = scan.proposal
    if proposal is not None:
        written = proposal.tensor_type_file if proposal.overrides else None
        cli.console.print(
            f"proposal ({proposal.why}): {', '.join(proposal.groups) or 'the base as it is'};"
            f" predicted mean KLD {proposal.predicted_kld_mean_nats:.5f} nats,"
            f" {proposal.predicted_size_bytes / 2**20:.2f} MiB"
            + (f"; written to {written}" if written else ""),
            highlight=False,
        )
    if scan.mix is not None:
        cli.console.print(
            f"built and measured: {scan.mix.kld_mean_nats:.5f} nats, {scan.mix.size_bytes / 2**20:.2f} MiB"
            f" (base {scan.base_type}: {scan.base.kld_mean_nats if scan.base else float('nan'):.5f} nats)",
            highlight=False,
        )
    cli.console.print(f"{RunDir(out).sensitivity_path}; {scan.seconds:.0f} s", highlight=False)


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
        kld: bool | None = typer.Option(
            None, "--kld/--no-kld", help="KL divergence from the F16 of the set [on]."
        ),
        kld_chunks: int | None = typer.Option(
            None, "--kld-chunks", help="Chunks compared for KLD [40; the base file grows with it]."
        ),
        kv_types: str | None = typer.Option(
            None, "--kv-types", help="KV cache types whose KLD cost is measured [f16,q8_0]."
        ),
        keep_kld_base: bool | None = typer.Option(
            None, "--keep-kld-base/--drop-kld-base", help="Keep the base logits in the cache [drop]."
        ),
        kld_base: Path | None = typer.Option(
            None, "--kld-base", help="The F16 to compare with (default: among MODELs or beside them)."
        ),
        sensitivity: bool = typer.Option(
            False, "--sensitivity", help="Scan MODEL (the reference) for the tensor groups that resist."
        ),
        base_type: str | None = typer.Option(None, "--base", help="Scan: the base type [Q4_K_M]."),
        raise_to: str | None = typer.Option(None, "--raise-to", help="Scan: a group raised to [q8_0]."),
        lower_to: str | None = typer.Option(None, "--lower-to", help="Scan: a group lowered to [q3_k]."),
        max_kld: float | None = typer.Option(
            None, "--max-kld", help="Scan: the mean KLD the proposed mix must meet [0.05]."
        ),
        scan_out: Path = typer.Option(
            Path("sensitivity"), "--scan-out", help="Scan: folder for sensitivity.json and the mix file."
        ),
        as_json: bool = typer.Option(False, "--json", help="Print the quality.json object."),
        out: Path | None = typer.Option(
            None, "--out", help="Add the results to this quality.json (created if absent)."
        ),
    ) -> None:
        """Measure perplexity and KL divergence from F16 with llama-perplexity (F16 < Q8_0 < Q4_K_M)."""
        cli = cli_context(ctx)
        settings = cli.config(
            {
                "quality.dataset": dataset,
                "quality.ctx": context_tokens,
                "quality.chunks": chunks,
                "quality.threads": threads,
                "quality.kld": kld,
                "quality.kld_chunks": kld_chunks,
                "quality.kld_cache_types": kv_types.split(",") if kv_types else None,
                "quality.kld_keep_base": keep_kld_base,
                "sensitivity.base": base_type,
                "sensitivity.raise_to": raise_to,
                "sensitivity.lower_to": lower_to,
                "report.max_kld_mean_nats": max_kld,
            }
        ).settings
        if sensitivity:
            _scan(cli, settings, models, scan_out)
            return
        if out is not None and check_out_file(out).exists():
            load_quality_file(out)  # a file that is not a quality.json is refused before measuring
        for model in [*models, *([kld_base] if kld_base else [])]:
            check_is_gguf(model)
        summaries = [read_gguf(model) for model in models]
        file_types = [summary.file_type for summary in summaries]
        # a file made with an importance matrix (its own metadata says so) is TYPE-imatrix
        kinds = [s.file_type + (IMATRIX_SUFFIX if imatrix_metadata(s.metadata) else "") for s in summaries]
        labels = result_labels(models, kinds)
        reference = find_reference(models, file_types, kld_base) if settings.quality.kld else None
        cache = cache_root(settings.toolchain.cache_dir, cli.environ)
        text = resolve_dataset(settings.quality.dataset, cache, cli.environ)
        with progress_bar(cli.err_console, "llama.cpp build") as progress:
            toolchain = ensure_toolchain(
                settings.toolchain, cli.environ, progress, gpu_layers=settings.server.gpu_layers
            )
        # with --out, llama-perplexity's own output is kept beside it, one log per run
        log_dir = RunDir(out.parent).logs_path if out is not None else None
        failures: list[str] = []
        attempt = _with_progress_bar(cli.err_console, failures)
        results = QualityFile()
        for model, label in zip(models, labels, strict=True):
            log = log_dir / f"llama-perplexity-{label}.log" if log_dir is not None else None
            measured = attempt(
                f"perplexity {model.name}",
                label,
                functools.partial(
                    measure_file_quality, toolchain, model, text, settings.quality, label,
                    out=out, log_path=log,
                ),
            )
            if measured is not None:
                results = results.with_result(label, measured)
        if reference is not None:
            kld_set = measure_kld_set(
                toolchain,
                reference,
                [KldFile(label, model) for model, label in zip(models, labels, strict=True)],
                text,
                cache,
                settings.quality,
                out,
                source_note_of(reference),
                attempt=attempt,
                log_dir=log_dir,
            )
            results = results.model_copy(update={"kld": kld_set})
        if failures and not results.results and (results.kld is None or not results.kld.results):
            raise MeasurementError(
                f"no file was measured ({len(failures)} run(s) failed, first: {failures[0]})",
                "see the errors above" + (f" and the logs in {log_dir}" if log_dir else ""),
            )
        if as_json:
            typer.echo(json.dumps(results.to_json(), indent=2))
        else:
            _print_results(cli.console, results, settings.quality.kld, len(settings.quality.kld_cache_types))
            for source_note in source_notes(models):
                cli.console.print(f"note: {source_note}", highlight=False)
            for label, result in results.results.items():
                cli.console.print(f"{label}: {result.model_path}", highlight=False)
            first = next(iter(results.results.values()), None)
            measured_text = first.dataset.sha256[:12] if first is not None else "-"
            cli.console.print(
                f"text: {text} (sha256 {measured_text}); llama.cpp: {toolchain.label}"
                + (f"; written to {out}" if out else ""),
                highlight=False,
            )
        if failures:
            where = f"; logs in {log_dir}" if log_dir is not None else ""
            cli.err_console.print(
                f"{len(failures)} llama-perplexity run(s) failed, the others were measured{where}:",
                highlight=False,
            )
            for failure in failures:
                cli.err_console.print(f"error: {failure}", highlight=False, soft_wrap=True)
            raise typer.Exit(1)


def _print_results(console: Console, results: QualityFile, kld_on: bool, cache_types: int) -> None:
    """The tables of a quality run."""
    if results.results:
        console.print(quality_table(results))
    if results.kld is not None:
        console.print(kld_table(results.kld))
        if cache_types > 1:
            console.print(kv_table(results.kld))
        console.print(kld_summary_line(results.kld), highlight=False)
    elif kld_on:
        console.print(
            "note: no KL divergence: no F16 among the files or in a manifest beside them"
            " (pass --kld-base F16.gguf, or --no-kld)",
            highlight=False,
        )
