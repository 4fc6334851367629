"""The report step: a run directory read into pandas, its statistics, plots and rendered report.

paths = build_report(run_dir, prometheus_url, settings.report)   # report.md/.html, table.csv, ...
paths = compare_runs(run_a, run_b, out_dir, settings.report)    # two runs side by side
"""

from __future__ import annotations

from quantload.analysis.compare import ComparePaths, compare_runs
from quantload.analysis.report import ReportError, ReportPaths, build_report

__all__ = ["ComparePaths", "ReportError", "ReportPaths", "build_report", "compare_runs"]
