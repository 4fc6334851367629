"""`quantload run`: the whole protocol on this machine, ending with where the report is."""

from __future__ import annotations

from pathlib import Path

import typer

from quantload.cli.context import cli_context
from quantload.cli.exclusive_option import EXCLUSIVE
from quantload.cli.file_args import given_files
from quantload.cli.run_view import RichRunView
from quantload.cli.slo_options import (
    CONFIDENCE,
    SLO_TPOT,
    SLO_TPOT_PERCENTILE,
    SLO_TTFT,
    SLO_TTFT_PERCENTILE,
    slo_flags,
)
from quantload.experiments.soak import duration_text_s
from quantload.llamacpp.toolchain import find_toolchain
from quantload.models.prepared import preflight
from quantload.paths import cache_root, check_out_dir
from quantload.stack.native import NativeRun


def register(app: typer.Typer) -> None:
    """Add the `run` command."""

    @app.command("run")
    def run(
        ctx: typer.Context,
        model: str | None = typer.Option(
            None, "--model", help="qwen2.5-0.5b (default, downloaded), smollm2-135m, tiny, tiny-moe"
            " or a local F16 .gguf",
        ),
        profile: str | None = typer.Option(
            None, "--profile", help="quick, full (default; also: seed), ci or wide (quick over seven types)."
        ),
        out: Path | None = typer.Option(None, "--out", help="Parent folder of run directories."),
        dataset: Path | None = typer.Option(
            None, "--dataset", help="WikiText-2 wiki.test.raw (else downloaded when online)."
        ),
        servers_at_once: bool | None = typer.Option(
            None, "--servers-at-once/--one-server-at-a-time",
            help="Start every quantization's server together (the compose layout).",
        ),
        duration: str | None = typer.Option(
            None, "--duration", help="Soak each server this long (e.g. 1h, 20m, 90s): the soak experiment."
        ),
        files: list[str] | None = typer.Option(
            None, "--files", help="GGUF files, a folder or hf:OWNER/REPO[:GLOB] to measure instead."
        ),
        reference: Path | None = typer.Option(
            None, "--reference", help="With --files: the F16/BF16/F32 file KLD is measured against."
        ),
        imatrix: str | None = typer.Option(
            None, "--imatrix", help="off, computed, or an imatrix file (prepare.imatrix) [off]."
        ),
        exclusive: bool | None = EXCLUSIVE,
        slo_ttft: float | None = SLO_TTFT,
        slo_ttft_percentile: str | None = SLO_TTFT_PERCENTILE,
        slo_tpot: float | None = SLO_TPOT,
        slo_tpot_percentile: str | None = SLO_TPOT_PERCENTILE,
        confidence: float | None = CONFIDENCE,
        more_files: list[str] | None = typer.Argument(None, hidden=True, metavar="[FILE]..."),
    ) -> None:
        """Prepare, measure quality and speed, serve each quantization under load, and report."""
        cli = cli_context(ctx)
        files = given_files(files, more_files)
        config = cli.config(
            {
                "model.source": model,
                "run.profile": profile,
                "run.out": out,
                "run.servers_at_once": servers_at_once,
                "quality.dataset": dataset,
                "soak.duration_s": duration_text_s(duration) if duration is not None else None,
                "prepare.files": tuple(files) if files else None,
                "prepare.reference": reference,
                "prepare.imatrix": imatrix,
                "load.exclusive": exclusive,
                **slo_flags(slo_ttft, slo_ttft_percentile, slo_tpot, slo_tpot_percentile, confidence),
            }
        )
        settings = config.settings
        check_out_dir(settings.run.out)
        cache = cache_root(settings.toolchain.cache_dir, cli.environ)
        built = find_toolchain(settings.toolchain, cli.environ)  # no build yet: only what is there
        preflight(settings.prepare, settings.quality, cache, built)
        with RichRunView(cli.err_console) as view:
            native = NativeRun(config, cli.environ, settings.run.out, view, cwd=cli.cwd)
            view.message(f"run directory: {native.run_dir}")
            outcome = native.execute()
        if outcome.report is not None:
            cli.console.print(f"report: {outcome.report.html}", highlight=False)
            cli.console.print(f"        {outcome.report.markdown}", highlight=False)
        cli.console.print(f"run directory: {outcome.run_dir}", highlight=False)
        for line in outcome.again:  # said at the start, minutes ago: said again where it is seen
            cli.err_console.print(line, highlight=False, markup=False, soft_wrap=True)
