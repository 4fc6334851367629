"""`build_report`: a run directory in, report.md, report.html, table.csv, summary.json and plots out.

The flow: read the run directory (run_data) -> compute every figure (analyze, which reads
Prometheus when one holds the run) -> draw the chapters' figures -> build the chapters into one
Document -> write it as Markdown and HTML, the quantization table as CSV and everything as JSON.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from quantload.analysis.analyze import Analysis, analyze_run
from quantload.analysis.chapters import build_document, figures
from quantload.analysis.csv_file import write_csv
from quantload.analysis.document import Image, render_html, render_markdown
from quantload.analysis.run_data import load_run
from quantload.analysis.summary_json import ReportFiles, summary_file
from quantload.config import PlanSettings, ReportSettings
from quantload.errors import ConfigError, QuantloadError
from quantload.paths import check_out_dir
from quantload.rundir import REPORT_HTML, REPORT_MD, RUN_FILES, TABLE_CSV
from quantload.rundir.handle import RunDir
from quantload.slo import Slo


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
    if not RunDir(run_dir).holds_run_files():
        raise ReportError(
            f"{run_dir} holds none of {', '.join(RUN_FILES)}",
            "give the folder `quantload run` wrote, e.g. results/<run-id>",
        )


def draw_figures(analysis: Analysis, out_dir: Path) -> dict[str, Image]:
    """Every figure the analysis has data for, by key; stale PNGs of an earlier report are removed."""
    folder = RunDir(out_dir).plots_path
    folder.mkdir(parents=True, exist_ok=True)
    for old in folder.glob("*.png"):
        old.unlink()
    drawn: dict[str, Image] = {}
    for figure in figures():
        path = figure.draw(analysis, RunDir(out_dir).plot_path(figure.key))
        if path is not None:
            drawn[figure.key] = Image(path.relative_to(out_dir).as_posix(), figure.title, figure.title)
    return drawn


def build_report(
    run_dir: Path,
    prometheus_url: str | None = None,
    settings: ReportSettings | None = None,
    out_dir: Path | None = None,
    prometheus_binary: str = "prometheus",
    plan: PlanSettings | None = None,
    slo: Slo | None = None,
) -> ReportPaths:
    """Write the report of `run_dir` (into `out_dir`, default the run directory itself).

    Missing inputs become "not measured" notes; only a folder that is not a run directory at
    all raises (ReportError), or one the report cannot be written into (ConfigError before any
    work; ReportError for what only the writing finds, such as a full disk).
    """
    check_run_dir(run_dir)
    out = out_dir or run_dir
    check_report_folder(out)
    analysis = analyze_run(
        load_run(run_dir), settings or ReportSettings(), prometheus_url, prometheus_binary, plan, slo
    )
    try:
        return _write(analysis, out)
    except OSError as error:  # what no check beforehand can see: a full disk, a file made meanwhile
        where = error.filename or out
        raise ReportError(
            f"the report could not be written: {where}: {error.strerror or error}",
            "free the disk or give another --out folder",
        ) from None


def check_report_folder(out: Path) -> None:
    """ConfigError, before any work, when the report cannot be written into `out`: the folder (or
    one of its files, or plots/) is not what it must be, or is not writable."""
    check_out_dir(out, "the report folder")
    hint = "move it away, or write the report elsewhere with --out"
    files = RunDir(out)
    for path in (files.report_md_path, files.report_html_path, files.table_csv_path, files.summary_path):
        name = path.name
        if path.is_dir():
            raise ConfigError(f"{path} is a folder, where the report writes its {name}", hint)
        if path.exists() and not os.access(path, os.W_OK):
            raise ConfigError(f"{path} is not writable, and the report writes its {name} there", hint)
    plots = files.plots_path
    if plots.exists() and not plots.is_dir():
        raise ConfigError(f"{plots} is a file, where the report keeps its plots", hint)
    if plots.is_dir() and not os.access(plots, os.W_OK | os.X_OK):
        raise ConfigError(f"{plots} is not writable, and the report keeps its plots there", hint)


def _write(analysis: Analysis, out: Path) -> ReportPaths:
    out.mkdir(parents=True, exist_ok=True)
    plots = draw_figures(analysis, out)
    document = build_document(analysis, plots)
    run_dir = RunDir(out)
    paths = ReportPaths(
        markdown=run_dir.report_md_path,
        html=run_dir.report_html_path,
        csv=run_dir.table_csv_path,
        summary=run_dir.summary_path,
        plots=tuple(out / image.file for image in plots.values()),
        not_measured=len(analysis.gaps),
    )
    paths.markdown.write_text(render_markdown(document), encoding="utf-8")
    paths.html.write_text(render_html(document, out), encoding="utf-8")
    write_csv(analysis.quant_table, paths.csv)
    named = ReportFiles(
        md=REPORT_MD, html=REPORT_HTML, csv=TABLE_CSV, plots=[image.file for image in plots.values()]
    )
    paths.summary.write_text(summary_file(analysis, named).to_json_text(), encoding="utf-8")
    return paths
