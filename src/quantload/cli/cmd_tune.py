"""`quantload tune`: search each quantization's server flags for the most load within the SLO."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from quantload.cli.context import cli_context
from quantload.cli.file_args import quant_labels
from quantload.cli.run_view import RichRunView
from quantload.cli.slo_options import (
    CONFIDENCE,
    SLO_TPOT,
    SLO_TPOT_PERCENTILE,
    SLO_TTFT,
    SLO_TTFT_PERCENTILE,
    slo_flags,
)
from quantload.errors import ConfigError
from quantload.paths import check_out_dir
from quantload.tune.tune_run import TuneResult, tune_json_text, tune_models


def _cell(value: Any, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _ranking(quant: str, summary: dict[str, Any]) -> Table:
    unit = "users" if summary["objective"] == "users" else "req/s"
    table = Table(
        "#",
        "configuration",
        "rung",
        f"limit ({unit})",
        "misses from",
        "final rung",
        "goodput req/s",
        "memory MiB",
        "KV MiB",
        "trials s",
        title=f"quantload tune {quant}: configurations, best first",
    )
    for row in summary["ranking"]:
        limit = "not measured" if not row["ran"] else _cell(row["limit"], 0 if unit == "users" else 2)
        if row.get("screened"):
            limit = "screened out"
        table.add_row(
            str(row["rank"]),
            row["key"],
            "-" if row["rung"] < 0 else str(row["rung"] + 1),
            limit,
            _cell(row["lowest_miss"], 0 if unit == "users" else 2),
            "yes" if row["final"] else "no",
            _cell(row["goodput_rps"], 2),
            _cell(row["memory_mib"], 0),
            _cell(row["kv_mib"], 0),
            _cell(row["seconds"], 0),
        )
    return table


def _show(cli: Any, result: TuneResult) -> None:
    for quant in result.quants:
        summary = quant.summary
        cli.console.print(_ranking(quant.quant, summary))
        for row in summary["ranking"]:
            if not row["ran"]:
                said = f"  {row['key']}: not measured: {row['why']}"
                cli.console.print(said, highlight=False, markup=False, soft_wrap=True)
        if summary.get("screening"):
            said = f"  {summary['screening']['sentence']}"
            cli.console.print(said, highlight=False, markup=False, soft_wrap=True)
        for note in summary.get("notes", []):
            cli.console.print(f"  note: {note}", highlight=False, markup=False, soft_wrap=True)
        if summary["winner"] is None:
            against = summary["against_baseline"]
            said = (
                against["sentence"]
                if against is not None
                else "no configuration was shown to meet the SLO at any level"
            )
            cli.console.print(f"{quant.quant}: no winner: {said}", highlight=False, soft_wrap=True)
            cli.console.print(f"  search: {summary['cost']['sentence']}", highlight=False, soft_wrap=True)
            continue
        cli.console.print(f"winner for {quant.quant}: {summary['winner']}", highlight=False)
        cli.console.print(f"  llama-server: {summary['command']}", highlight=False, soft_wrap=True)
        cli.console.print("  .env: " + "  ".join(summary["env"]), highlight=False)
        cli.console.print("  compose override (e.g. docker-compose.tuned.yml):", highlight=False)
        cli.console.print(summary["compose_override"], highlight=False, markup=False)
        cli.console.print(f"  search: {summary['cost']['sentence']}", highlight=False, soft_wrap=True)
        if summary["against_baseline"] is not None:
            said = summary["against_baseline"]["sentence"]
            cli.console.print(f"  against the configured flags: {said}", highlight=False, soft_wrap=True)
        for line in summary["plan_lines"]:
            cli.console.print(f"  plan: {line}", highlight=False, soft_wrap=True)
    cli.console.print(f"run directory: {result.run_dir} (tune.json, tune.jsonl)", highlight=False)


def register(app: typer.Typer) -> None:
    """Add the `tune` command."""

    @app.command("tune")
    def tune(
        ctx: typer.Context,
        model: str | None = typer.Option(
            None, "--model", help="qwen2.5-0.5b, smollm2-135m, tiny, tiny-moe or a local F16 .gguf"
        ),
        quants: str | None = typer.Option(None, "--quants", help="Quantizations to tune, e.g. Q8_0,Q4_K_M."),
        profile: str | None = typer.Option(
            None, "--profile", help="quick, full, ci or wide (the limit search's presets)."
        ),
        out: Path | None = typer.Option(None, "--out", help="Parent folder of run directories."),
        resume: Path | None = typer.Option(
            None, "--resume", help="Go on with the tune in this run directory."
        ),
        budget: float | None = typer.Option(
            None, "--budget", help="Seconds per quantization, trials and baseline together (tune.budget_s)."
        ),
        objective: str | None = typer.Option(None, "--objective", help="users or rate (tune.objective)."),
        predict_first: bool | None = typer.Option(
            None, "--predict-first/--measure-all",
            help="Measure only what the predicted limits cannot separate from the best (tune.predict_first).",
        ),
        slo_ttft: float | None = SLO_TTFT,
        slo_ttft_percentile: str | None = SLO_TTFT_PERCENTILE,
        slo_tpot: float | None = SLO_TPOT,
        slo_tpot_percentile: str | None = SLO_TPOT_PERCENTILE,
        confidence: float | None = CONFIDENCE,
        as_json: bool = typer.Option(False, "--json", help="Print the outcome as JSON."),
    ) -> None:
        """Search the tune space of llama-server flags ([tune]) per quantization: successive halving by the
        limit search, the winner's command line, .env and compose lines, and its capacity plan."""
        cli = cli_context(ctx)
        flags: dict[str, Any] = {
            "model.source": model,
            "prepare.quants": quant_labels(quants),
            "run.profile": profile,
            "run.out": out,
            "tune.budget_s": budget,
            "tune.objective": objective,
            "tune.predict_first": predict_first,
            **slo_flags(slo_ttft, slo_ttft_percentile, slo_tpot, slo_tpot_percentile, confidence),
        }
        config = cli.config(flags)
        settings = config.settings
        if resume is not None and not resume.is_dir():
            raise ConfigError(f"--resume {resume} is not a folder", "give the run directory of a tune")
        check_out_dir(settings.run.out)
        with RichRunView(cli.err_console) as view:
            result = tune_models(config, cli.environ, settings.run.out, view, resume=resume, cwd=cli.cwd)
        if as_json:
            typer.echo(tune_json_text(result))
        else:
            _show(cli, result)
        for failure in result.failures:  # each said as it happened; again where it is seen
            cli.err_console.print(f"error: {failure}", highlight=False, markup=False, soft_wrap=True)
        if result.failures:
            raise typer.Exit(1)
