"""`quantload report --compare RUN_A RUN_B`: two runs side by side, with deltas.

Each run is analysed from its own files (Prometheus is not needed: the compared figures all come
from the run directories). A figure missing in either run shows as – and no delta is invented.
Which run is better is decided (quantload.comparison), never read off a delta: latency percentiles
and output rates from the two levels' requests with a bootstrap interval, perplexity and KL
divergence against their standard errors, the users sustained from the decided limits, the file
size exactly; where the data do not show a difference the row says "no difference shown".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.analyze import Analysis, analyze, run_slo
from quantload.analysis.csv_file import write_csv
from quantload.analysis.document import (
    Block,
    Bullets,
    Document,
    Paragraph,
    Section,
    Table,
    render_html,
    render_markdown,
)
from quantload.analysis.prometheus_source import PromConnection
from quantload.analysis.report import check_run_dir
from quantload.analysis.run_data import load_run
from quantload.analysis.run_tables import level_column, users_levels
from quantload.analysis.stage_tables import USABLE
from quantload.comparison import Comparison, Side, compare_limits, compare_normal, compare_percentiles
from quantload.config import ReportSettings
from quantload.experiments.registry import reported
from quantload.slo import Slo

COMPARE_MD = "compare.md"
COMPARE_HTML = "compare.html"
COMPARE_CSV = "compare.csv"


@dataclass(frozen=True)
class ComparePaths:
    """Where the comparison was written."""

    markdown: Path
    html: Path
    csv: Path


Reader = Callable[[Analysis, str], float | None]  # one figure of one model file in one run


@dataclass(frozen=True)
class Metric:
    """One compared figure: how to read it from an analysis, how to show it, which way is better."""

    name: str
    read: Callable[[Analysis, str], float | None]
    show: Callable[[float | None], str]
    lower_is_better: bool
    signed: bool = False  # `show` already prints a sign
    # A against B, decided (None: the figure is not compared, e.g. an accuracy figure)
    decide: Callable[[Analysis, Analysis, str], Comparison | None] | None = None

    def delta_text(self, delta: float | None) -> str:
        """B - A in the figure's own units, with its sign."""
        if delta is None:
            return fmt.DASH
        if self.signed:
            return self.show(delta)
        return ("+" if delta > 0 else "−" if delta < 0 else "±") + self.show(abs(delta))


def _from_table(column: str) -> Callable[[Analysis, str], float | None]:
    def read(analysis: Analysis, quant: str) -> float | None:
        table = analysis.quant_table
        rows = table[table["quant"] == quant] if not table.empty else table
        if rows.empty or column not in rows:
            return None
        value = rows.iloc[0][column]
        return None if value is None or pd.isna(value) else float(value)

    return read


def _capacity(analysis: Analysis, quant: str) -> float | None:
    found = [v.max_users for v in analysis.capacity if v.quant == quant]
    return float(found[0]) if found and found[0] is not None else None


def _experiment_metrics() -> list[Metric]:
    """The experiments' figures (ExperimentReport.compared), each read from its findings in each
    run, in the registry's order."""

    def reader(name: str, read: Callable[[Any, str], float | None]) -> Reader:
        def figure(analysis: Analysis, quant: str) -> float | None:
            return read(analysis.findings[name], quant) if name in analysis.findings else None

        return figure

    return [
        Metric(figure.name, reader(experiment.name, figure.read), figure.show, figure.lower_is_better)
        for experiment, part in reported()
        for figure in part.compared
    ]


def _kv_diff(analysis: Analysis, quant: str) -> float | None:
    found = [k.diff_pct for k in analysis.kv if k.quant == quant]
    return found[0] / 100 if found and found[0] is not None else None


def _exact(column: str) -> Callable[[Analysis, Analysis, str], Comparison | None]:
    """A figure measured exactly (a file's size): any difference is a difference."""

    def decide(a: Analysis, b: Analysis, quant: str) -> Comparison | None:
        value_a, value_b = _from_table(column)(a, quant), _from_table(column)(b, quant)
        if value_a is None or value_b is None or not value_b:
            return None
        better: Side | None = None if value_a == value_b else ("a" if value_a > value_b else "b")
        ratio = value_a / value_b
        return Comparison(better, ratio, ratio, ratio, 1.0, "measured exactly")

    return decide


def _with_error(column: str, error: str) -> Callable[[Analysis, Analysis, str], Comparison | None]:
    """A figure with its standard error (perplexity, KLD)."""

    def decide(a: Analysis, b: Analysis, quant: str) -> Comparison | None:
        values = [_from_table(name)(run, quant) for run in (a, b) for name in (column, error)]
        if any(v is None for v in values):
            return None
        value_a, error_a, value_b, error_b = (float(v) for v in values if v is not None)
        return compare_normal(value_a, error_a, value_b, error_b, a.slo.confidence)

    return decide


def _level_values(analysis: Analysis, quant: str, users: int, column: str) -> list[float]:
    """Every measured ok request's `column` at `users` of the sweep (its usable repeats together)."""
    stages, records = analysis.stages, analysis.run.records
    if stages.empty or records.empty:
        return []
    chosen = stages[
        stages["experiment"].eq("sweep") & stages["quant"].eq(quant) & stages["users"].eq(users)
        & stages["status"].isin(USABLE)
    ]  # fmt: skip
    mine = records[records["stage_id"].isin(chosen["stage_id"]) & records["ok"] & ~records["warmup"]]
    if column == "output_rate":
        return [float(t) / float(e) for t, e in zip(mine["completion_tokens"], mine["e2e_s"], strict=True)
                if t and e and e > 0]  # fmt: skip
    return [float(x) for x in mine[column].dropna()] if column in mine else []


def _requests(column: str, users: int, q: float) -> Callable[[Analysis, Analysis, str], Comparison | None]:
    def decide(a: Analysis, b: Analysis, quant: str) -> Comparison | None:
        mine, theirs = _level_values(a, quant, users, column), _level_values(b, quant, users, column)
        if not mine or not theirs:
            return None
        return compare_percentiles(mine, theirs, q, a.slo.confidence)

    return decide


def _limits(a: Analysis, b: Analysis, quant: str) -> Comparison | None:
    found_a = [v for v in a.capacity if v.quant == quant]
    found_b = [v for v in b.capacity if v.quant == quant]
    if not found_a or not found_b:
        return None
    return compare_limits(found_a[0].limit_range(), found_b[0].limit_range(), a.slo.confidence)


def metrics(levels: list[int]) -> list[Metric]:
    """The figures compared, the quantization table's first."""
    chosen = [
        Metric("file size", _from_table("file_size_bytes"), fmt.mib, True, decide=_exact("file_size_bytes")),
        Metric(
            "perplexity", _from_table("perplexity"), lambda v: fmt.number(v, 3), True,
            decide=_with_error("perplexity", "perplexity_error"),
        ),
        Metric(
            "mean KLD from F16 (nats)", _from_table("kld_mean_nats"), lambda v: fmt.number(v, 6), True,
            decide=_with_error("kld_mean_nats", "kld_mean_error_nats"),
        ),
        Metric("prefill tok/s (llama-bench)", _from_table("prefill_tok_s"), fmt.number, False),
        Metric("decode tok/s (llama-bench)", _from_table("decode_tok_s"), fmt.number, False),
    ]  # fmt: skip
    for users in levels:
        chosen += [
            Metric(
                f"TTFT p50 @{users}u", _from_table(level_column("ttft_p50_s", users)), fmt.duration, True,
                decide=_requests("ttft_s", users, 50),
            ),
            Metric(
                f"TTFT p99 @{users}u", _from_table(level_column("ttft_p99_s", users)), fmt.duration, True,
                decide=_requests("ttft_s", users, 99),
            ),
            Metric(
                f"output tok/s @{users}u", _from_table(level_column("output_tok_s", users)), fmt.number,
                False, decide=_requests("output_rate", users, 50),
            ),
        ]  # fmt: skip
    chosen += [
        Metric("users sustained under the SLO", _capacity, lambda v: fmt.number(v, 0), False, decide=_limits),
        *_experiment_metrics(),
        Metric("KV predicted vs reported", _kv_diff, lambda v: fmt.percent(v, 2, True), True, signed=True),
    ]
    return chosen


def _delta_row(metric: Metric, quant: str, a: Analysis, b: Analysis) -> dict[str, Any]:
    value_a, value_b = metric.read(a, quant), metric.read(b, quant)
    delta = value_b - value_a if value_a is not None and value_b is not None else None
    relative = delta / value_a if delta is not None and value_a else None
    comparison = metric.decide(a, b, quant) if metric.decide is not None and delta is not None else None
    better = None
    decided = "not compared"
    if comparison is not None:
        shown = comparison.better
        if shown is not None:  # the larger side; for a cost, lower is better
            larger = "A" if shown == "a" else "B"
            better = larger if not metric.lower_is_better else ("B" if larger == "A" else "A")
        decided = comparison.text("A", "B")
    return {
        "quant": quant,
        "metric": metric.name,
        "a": value_a,
        "b": value_b,
        "delta": delta,
        "delta_frac": relative,
        "better": better,
        "decided": decided,
    }


COMPARE_READS = (
    "a comparison reads the two run folders only; `quantload report RUN` shows each run's Prometheus"
    " sections"
)


def _offline(run_dir: Path, settings: ReportSettings, slo: Slo | None) -> Analysis:
    run = load_run(run_dir)
    connection = PromConnection(None, "", ["not read for a comparison"], how=COMPARE_READS)
    return analyze(run, settings, run_slo(run, slo), connection, 1.0)


def compare_rows(a: Analysis, b: Analysis) -> tuple[list[dict[str, Any]], list[Metric]]:
    """One row per (quant, metric) of either run: a, b, delta, delta_frac, better."""
    levels = sorted(set(users_levels(a.run, a.levels)) | set(users_levels(b.run, b.levels)))
    chosen = metrics(levels)
    quants = list(dict.fromkeys([*a.quants, *b.quants]))
    return [_delta_row(metric, quant, a, b) for quant in quants for metric in chosen], chosen


def unrelated(a: Analysis, b: Analysis) -> list[str]:
    """What keeps two runs from being compared like with like: another model, no quantization in
    common (each a sentence; none when they are related)."""
    said = []
    if a.header.model and b.header.model and a.header.model != b.header.model:
        said.append(
            f"The two runs measured different models (A: {a.header.model}; B: {b.header.model}): each"
            " row sets figures of one model beside the other's."
        )
    if a.quants and b.quants and not set(a.quants) & set(b.quants):
        said.append(
            f"The two runs share no quantization (A: {', '.join(a.quants)}; B: {', '.join(b.quants)}):"
            " every row has a figure on one side only, so nothing is compared."
        )
    return said


def _document(a: Analysis, b: Analysis, rows: list[dict[str, Any]], chosen: list[Metric]) -> Document:
    by_name = {m.name: m for m in chosen}
    facts = [("run", a.header.run_id, b.header.run_id)]
    right = dict(b.header.facts())
    for label, left in a.header.facts()[1:]:
        facts.append((label, left, right.get(label, fmt.DASH)))
    blocks: list[Block] = [Paragraph(line, "warning") for line in unrelated(a, b)]
    blocks.append(Table(("", "A", "B"), tuple(facts), (False, False, False)))
    cells = []
    for r in rows:
        metric = by_name[r["metric"]]
        cells.append(
            (
                str(r["quant"]),
                metric.name,
                metric.show(r["a"]),
                metric.show(r["b"]),
                metric.delta_text(r["delta"]),
                fmt.percent(r["delta_frac"], 1, True),
                r["better"] or ("no difference shown" if r["decided"] != "not compared" else fmt.DASH),
                r["decided"],
            )
        )
    table = Table(
        ("quant", "figure", "A", "B", "B − A", "change", "better", "how it was decided"),
        tuple(cells),
        (False, False, True, True, True, True, False, False),
        "Load figures are medians of repeats; – = not measured in that run, so no delta. Better is"
        " decided: only where the two runs' requests (or the figures' own errors) show a difference"
        f" at {a.slo.confidence:.0%} confidence; llama-bench's figures are not compared.",
    )
    verdicts = [f"A: {v.sentence}" for v in a.capacity] + [f"B: {v.sentence}" for v in b.capacity]
    gaps = [f"A {g.text()}" for g in a.gaps] + [f"B {g.text()}" for g in b.gaps]
    sections = [
        Section("runs", "The two runs", tuple(blocks)),
        Section("deltas", "Side by side", (table,)),
        Section("verdicts", "Capacity verdicts", (Bullets(tuple(verdicts), "verdict"),)),
    ]
    if gaps:
        sections.append(
            Section(
                "gaps",
                "Not measured",
                (Paragraph("Figures missing in either run:"), Bullets(tuple(gaps), "warning")),
            )
        )
    return Document(
        f"quantload comparison: {a.header.run_id} (A) and {b.header.run_id} (B)",
        f"A = {a.run.run_dir}, B = {b.run.run_dir}",
        tuple(sections),
    )


def compare_runs(
    run_a: Path,
    run_b: Path,
    out_dir: Path | None = None,
    settings: ReportSettings | None = None,
    slo: Slo | None = None,
) -> ComparePaths:
    """Write compare.md, compare.html and compare.csv for two run directories, both judged against
    `slo` (None: each against its own)."""
    check_run_dir(run_a)
    check_run_dir(run_b)
    report = settings or ReportSettings()
    a, b = _offline(run_a, report, slo), _offline(run_b, report, slo)
    out = out_dir or Path.cwd() / f"compare-{a.header.run_id}-vs-{b.header.run_id}"
    out.mkdir(parents=True, exist_ok=True)
    rows, chosen = compare_rows(a, b)
    document = _document(a, b, rows, chosen)
    paths = ComparePaths(out / COMPARE_MD, out / COMPARE_HTML, out / COMPARE_CSV)
    paths.markdown.write_text(render_markdown(document), encoding="utf-8")
    paths.html.write_text(render_html(document, out), encoding="utf-8")
    write_csv(pd.DataFrame(rows), paths.csv)
    return paths
