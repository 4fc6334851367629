"""The report step: a run directory read into pandas, its statistics, plots and rendered report.

paths = build_report(run_dir, prometheus_url, settings.report)   # report.md/.html, table.csv, ...
paths = compare_runs(run_a, run_b, out_dir, settings.report)    # two runs side by side

The flow (report.py): run_data reads the run directory -> analyze computes every figure into one
Analysis -> each chapter draws its figures and builds its sections -> document renders them.
Computation is grouped by what it reads:
  the run's files        run_data (RunData, gaps), run_tables (header, quantization table, KV, roofline)
  records and stages     stage_tables (stages, levels, client health), capacity (and limits.jsonl),
                         capacity_plan and scale_out (servers for a target, when to add one),
                         ttft_tables, littles_law (an experiment with a part of its own in the
                         report has its tables in its folder: quantload.experiments)
  quality.json's KLD     quality_loss (rows, sentences), quality_verdict (capacity at a quality limit),
                         kv_types (the KV-cache type trade-off, with kv.json and the kv_types stages)
  Prometheus             prometheus_source (finding one with the run's data), prometheus_tables
Rendering: chapters/ (one module per chapter, each owning its figures), plotting, document, fmt;
summary_json writes the machine-readable copy. A new figure is a draw function, a `Figure` and
its placement in one chapter module; one that needs a new computation adds that computation (in
the module for its input) and its field and call in analyze.py: three files at most (a fourth,
summary_json.py, only when its table should also be in summary.json). An experiment with a part
of its own in the report (the prompt-cache, context, noisy-neighbour and kv_types experiments)
keeps its tables, chapter and findings in its folder under quantload.experiments instead (see
experiments.base.ExperimentReport).
"""

from __future__ import annotations

from quantload.analysis.compare import ComparePaths, compare_runs
from quantload.analysis.report import ReportError, ReportPaths, build_report

__all__ = ["ComparePaths", "ReportError", "ReportPaths", "build_report", "compare_runs"]
