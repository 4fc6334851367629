"""`quantload report`: the report of a run directory, or two runs side by side."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from quantload.analysis import build_report, compare_runs
from quantload.analysis.summary_json import SummaryFile, load_summary_file
from quantload.cli.context import cli_context
from quantload.cli.slo_options import (
    CONFIDENCE,
    SLO_TPOT,
    SLO_TPOT_PERCENTILE,
    SLO_TTFT,
    SLO_TTFT_PERCENTILE,
    slo_flags,
    slo_given,
)
from quantload.errors import ConfigError
from quantload.paths import check_out_dir
from quantload.slo import Slo


def _money(amount: Any, currency: str) -> str:
    return "-" if amount is None else f"{amount:.6g} {currency}".strip()


def plan_table(summary: SummaryFile) -> Table:
    """The plan, one row per quantization, as summary.json holds it."""
    plan = summary.plan
    currency = str(plan.inputs.get("currency") or "")
    table = Table(
        "quant", "users/server", "req/s/server", "servers", "utilisation", "memory/server",
        "cost/request (plan)", "cost/M output tokens (plan)", title="capacity plan",
    )  # fmt: skip
    for row in plan.quants:
        limit, memory, costs = row["limit"], row.get("memory") or {}, row.get("costs") or {}
        count = row.get("by_rate") or row.get("by_users") or {}
        table.add_row(
            str(row["quant"]),
            "-" if limit["users"] is None else str(limit["users"]),
            "-" if limit["rps"] is None else f"{limit['rps']:.3g}",
            "-" if row.get("servers") is None else str(row["servers"]),
            "-" if not count else f"{count['utilisation']:.0%}",
            "-" if not memory else f"{memory['total_bytes'] / 2**20:,.1f} MiB",
            _money(costs.get("per_request_planned"), currency),
            _money(costs.get("per_million_output_planned"), currency),
        )
    return table


def plan_lines(summary: SummaryFile) -> list[str]:
    """What the plan left out and which quantization needs the fewest servers."""
    lines = list(summary.plan.missing)
    if summary.plan.fewest_servers:
        lines.append(f"fewest servers: {summary.plan.fewest_servers}")
    return lines


def register(app: typer.Typer) -> None:
    """Add the `report` command."""

    @app.command("report")
    def report(
        ctx: typer.Context,
        run_dir: Path | None = typer.Argument(None, help="A run directory, e.g. results/<run-id>."),
        prometheus: str | None = typer.Option(
            None, "--prometheus", help="URL of a Prometheus holding the run (default: the run's own)."
        ),
        slo_ttft: float | None = SLO_TTFT,
        slo_ttft_percentile: str | None = SLO_TTFT_PERCENTILE,
        slo_tpot: float | None = SLO_TPOT,
        slo_tpot_percentile: str | None = SLO_TPOT_PERCENTILE,
        confidence: float | None = CONFIDENCE,
        slo_ttft_p99: float | None = typer.Option(
            None, "--slo-ttft-p99", hidden=True, help="TTFT p99 limit, s (the earlier name of --slo-ttft)."
        ),
        max_kld: float | None = typer.Option(
            None, "--max-kld", help="Quality loss the verdict accepts: mean KLD from F16, nats [0.05]."
        ),
        compare: tuple[Path, Path] | None = typer.Option(
            None, "--compare", help="Two run directories to put side by side.", metavar="RUN_A RUN_B"
        ),
        out: Path | None = typer.Option(
            None,
            "--out",
            help="Folder to write into (default: the run directory; with --compare: ./compare-<A>-vs-<B>).",
        ),
        plan: bool = typer.Option(False, "--plan", help="Also print the capacity plan here."),
        target_rps: float | None = typer.Option(None, "--target-rps", help="Plan: requests/s to serve."),
        target_users: int | None = typer.Option(None, "--target-users", help="Plan: concurrent users."),
        headroom: float | None = typer.Option(None, "--headroom", help="Plan: limit share kept free [0.3]."),
        price_per_hour: float | None = typer.Option(None, "--price-per-hour", help="Plan: server price."),
        currency: str | None = typer.Option(None, "--currency", help="Plan: the price's unit, e.g. USD."),
        memory_budget_gib: float | None = typer.Option(
            None, "--memory-budget-gib", help="Plan: memory one server may use, GiB."
        ),
    ) -> None:
        """Write report.md, report.html, table.csv, summary.json and plots/ for a run directory.

        The report's capacity plan uses the [plan] settings; the --target-*, --headroom, --price-*,
        --currency and --memory-budget-gib flags set them for this report, on any finished run.
        """
        cli = cli_context(ctx)
        config = cli.config(
            {
                **slo_flags(
                    slo_ttft if slo_ttft is not None else slo_ttft_p99, slo_ttft_percentile, slo_tpot,
                    slo_tpot_percentile, confidence,
                ),
                "report.max_kld_mean_nats": max_kld,
                "plan.target_rps": target_rps,
                "plan.target_users": target_users,
                "plan.headroom_frac": headroom,
                "plan.price_per_hour": price_per_hour,
                "plan.currency": currency,
                "plan.memory_budget_gib": memory_budget_gib,
            }
        )
        settings = config.settings
        slo = Slo.of(settings.slo) if slo_given(config) else None  # None: each run's own
        if out is not None:
            check_out_dir(out)
        if compare is not None:
            if run_dir is not None:
                raise ConfigError("give either RUN_DIR or --compare RUN_A RUN_B, not both")
            paths = compare_runs(compare[0], compare[1], out, settings.report, slo)
            cli.console.print(
                f"comparison: {paths.html}\n            {paths.markdown}", highlight=False, soft_wrap=True
            )
            return
        if run_dir is None:
            raise ConfigError("no run directory given", "quantload report results/<run-id>")
        written = build_report(
            run_dir, prometheus, settings.report, out, settings.observe.prometheus_binary, settings.plan, slo
        )
        cli.console.print(
            f"report: {written.html}\n        {written.markdown}", highlight=False, soft_wrap=True
        )
        cli.console.print(f"table:  {written.csv}", highlight=False, soft_wrap=True)
        if plan:
            cli.console.print(plan_table(load_summary_file(written.summary)))
            for line in plan_lines(load_summary_file(written.summary)):
                cli.console.print(line, highlight=False, soft_wrap=True)
        if written.not_measured:
            cli.console.print(
                f"{written.not_measured} thing(s) were not measured; the report says which and why",
                highlight=False,
                soft_wrap=True,
            )
