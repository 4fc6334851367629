"""`build_report`: a run directory in, report.md, report.html, table.csv, summary.json and plots out."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from quantload.analysis import plots as draw
from quantload.analysis.analyze import Analysis, analyze, load_window
from quantload.analysis.load_run import RunData, load_run
from quantload.analysis.prom_source import open_prometheus
from quantload.analysis.render_html import render_html
from quantload.analysis.render_md import render_markdown
from quantload.analysis.sections import build_document
from quantload.analysis.stages import stage_table
from quantload.analysis.summary_json import summary
from quantload.config import ReportSettings
from quantload.errors import QuantloadError
from quantload.rundir import RUN_JSON

PLOTS_DIR = "plots"
REPORT_MD = "report.md"
REPORT_HTML = "report.html"
TABLE_CSV = "table.csv"
SUMMARY_JSON = "summary.json"
RUN_FILES = (
    RUN_JSON,
    "config.json",
    "manifest.json",
    "quality.json",
    "speed.json",
    "kv.json",
    "records.jsonl",
)


class ReportError(QuantloadError):
    """The folder given is not a run directory at all."""


@dataclass(frozen=True)
class ReportPaths:
    """Where the report's files were written."""

    markdown: Path
    html: Path
    csv: Path
    summary: Path
    plots: tuple[Path, ...]
    not_measured: int

    def all(self) -> list[Path]:
        return [self.markdown, self.html, self.csv, self.summary, *self.plots]


def check_run_dir(run_dir: Path) -> None:
    """ReportError unless `run_dir` is a folder holding at least one run file."""
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir} is not a folder", "give a run directory, e.g. results/<run-id>")
    if not any((run_dir / name).is_file() for name in RUN_FILES):
        raise ReportError(
            f"{run_dir} holds none of {', '.join(RUN_FILES)}",
            "give the folder `quantload run` wrote, e.g. results/<run-id>",
        )


def draw_plots(analysis: Analysis, folder: Path) -> dict[str, Path | None]:
    """Every figure the analysis has data for; stale PNGs of an earlier report are removed."""
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.png"):
        old.unlink()
    quants = analysis.quants
    return {
        "ttft_vs_concurrency": draw.ttft_vs_concurrency(
            analysis.levels, quants, analysis.slo, folder / "ttft_vs_concurrency.png"
        ),
        "throughput_vs_concurrency": draw.throughput_vs_concurrency(
            analysis.levels, quants, folder / "throughput_vs_concurrency.png"
        ),
        "latency_vs_throughput": draw.latency_vs_throughput(
            analysis.levels, quants, analysis.slo, folder / "latency_vs_throughput.png"
        ),
        "quality_speed_size": draw.quality_speed_size(
            analysis.seed, quants, folder / "quality_speed_size.png"
        ),
        "server_timeseries": draw.server_timeseries(
            analysis.server_series, analysis.stages, quants, folder / "server_timeseries.png"
        ),
    }


def analyze_run(
    run: RunData,
    settings: ReportSettings,
    prometheus_url: str | None = None,
    prometheus_binary: str = "prometheus",
) -> Analysis:
    """Every figure of one run, reading Prometheus when one with the run's data can be found."""
    scrape = run.setting("observe", "scrape_interval_s")
    scrape_s = float(scrape) if isinstance(scrape, int | float) and scrape > 0 else 1.0
    window = load_window(stage_table(run, settings))
    with open_prometheus(run, prometheus_url, window, prometheus_binary) as connection:
        return analyze(run, settings, connection, scrape_s)


def build_report(
    run_dir: Path,
    prometheus_url: str | None = None,
    settings: ReportSettings | None = None,
    out_dir: Path | None = None,
    prometheus_binary: str = "prometheus",
) -> ReportPaths:
    """Write the report of `run_dir` (into `out_dir`, default the run directory itself).

    Missing inputs become "not measured" notes; only a folder that is not a run directory at
    all raises (ReportError).
    """
    check_run_dir(run_dir)
    out = out_dir or run_dir
    out.mkdir(parents=True, exist_ok=True)
    analysis = analyze_run(load_run(run_dir), settings or ReportSettings(), prometheus_url, prometheus_binary)
    figures = draw_plots(analysis, out / PLOTS_DIR)
    document = build_document(analysis, figures, out)
    paths = ReportPaths(
        markdown=out / REPORT_MD,
        html=out / REPORT_HTML,
        csv=out / TABLE_CSV,
        summary=out / SUMMARY_JSON,
        plots=tuple(p for p in figures.values() if p is not None),
        not_measured=len(analysis.gaps),
    )
    paths.markdown.write_text(render_markdown(document), encoding="utf-8")
    paths.html.write_text(render_html(document, out), encoding="utf-8")
    analysis.seed.to_csv(paths.csv, index=False, float_format="%.6g")
    files = {
        "md": REPORT_MD,
        "html": REPORT_HTML,
        "csv": TABLE_CSV,
        "plots": [p.relative_to(out).as_posix() for p in paths.plots],
    }
    paths.summary.write_text(json.dumps(summary(analysis, files), indent=2) + "\n", encoding="utf-8")
    return paths
