"""`quantload report`: the report of a run directory, or two runs side by side."""

from __future__ import annotations

from pathlib import Path

import typer

from quantload.analysis import build_report, compare_runs
from quantload.cli.context import cli_context
from quantload.errors import ConfigError
from quantload.paths import check_out_dir


def register(app: typer.Typer) -> None:
    """Add the `report` command."""

    @app.command("report")
    def report(
        ctx: typer.Context,
        run_dir: Path | None = typer.Argument(None, help="A run directory, e.g. results/<run-id>."),
        prometheus: str | None = typer.Option(
            None, "--prometheus", help="URL of a Prometheus holding the run (default: the run's own)."
        ),
        slo_ttft_p99: float | None = typer.Option(None, "--slo-ttft-p99", help="TTFT p99 limit, s [1.0]."),
        slo_tpot: float | None = typer.Option(None, "--slo-tpot", help="TPOT p99 limit, s [0.1]."),
        compare: tuple[Path, Path] | None = typer.Option(
            None, "--compare", help="Two run directories to put side by side.", metavar="RUN_A RUN_B"
        ),
        out: Path | None = typer.Option(
            None,
            "--out",
            help="Folder to write into (default: the run directory; with --compare: ./compare-<A>-vs-<B>).",
        ),
    ) -> None:
        """Write report.md, report.html, table.csv, summary.json and plots/ for a run directory."""
        cli = cli_context(ctx)
        settings = cli.config({"report.slo_ttft_p99_s": slo_ttft_p99, "report.slo_tpot_s": slo_tpot}).settings
        if out is not None:
            check_out_dir(out)
        if compare is not None:
            if run_dir is not None:
                raise ConfigError("give either RUN_DIR or --compare RUN_A RUN_B, not both")
            paths = compare_runs(compare[0], compare[1], out, settings.report)
            cli.console.print(
                f"comparison: {paths.html}\n            {paths.markdown}", highlight=False, soft_wrap=True
            )
            return
        if run_dir is None:
            raise ConfigError("no run directory given", "quantload report results/<run-id>")
        written = build_report(run_dir, prometheus, settings.report, out, settings.observe.prometheus_binary)
        cli.console.print(
            f"report: {written.html}\n        {written.markdown}", highlight=False, soft_wrap=True
        )
        cli.console.print(f"table:  {written.csv}", highlight=False, soft_wrap=True)
        if written.not_measured:
            cli.console.print(
                f"{written.not_measured} thing(s) were not measured; the report says which and why",
                highlight=False,
                soft_wrap=True,
            )
