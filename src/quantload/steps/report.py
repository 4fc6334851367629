"""The report step: report.md, report.html, table.csv, summary.json and plots of a run directory."""

from __future__ import annotations

from pathlib import Path

from quantload.analysis import ReportPaths, build_report
from quantload.config import Settings


def write_report(
    run_dir: Path, settings: Settings, prometheus_url: str | None = None, out_dir: Path | None = None
) -> ReportPaths:
    """The report of `run_dir` (into `out_dir`, default the run directory itself).

    `prometheus_url` is a Prometheus holding the run's series; without one the report reopens
    the run's saved Prometheus data when it can.
    """
    return build_report(
        run_dir, prometheus_url, settings.report, out_dir, settings.observe.prometheus_binary,
        plan=settings.plan,
    )  # fmt: skip
