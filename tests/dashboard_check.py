"""Test helper: every query a Grafana dashboard runs, with its variables substituted the way Grafana does,
and a check that each one returns data from a Prometheus.

Grafana's Prometheus datasource replaces `$var` / `${var}` by the selected value, regex-escaped;
several values become `(a|b)` and "All" becomes the variable's `allValue` (here `.*`).
`$__interval` is the query step, `$__rate_interval` is max(step + scrape interval,
4 x scrape interval), `$__range` the whole time range.

A query that reads a GPU series (`quantload_gpu_*`, from NVML) `needs_gpu`: on a machine without
an NVIDIA GPU those series cannot exist, so a check there expects such a query to run without
error and return nothing, and where the exporter has a GPU it must return data like any other.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from quantload.errors import QuantloadError
from quantload.exporter.names import GPU_PREFIX
from quantload.observe.promql import PrometheusClient, PrometheusQueryError

QueryKind = Literal["panel", "annotation", "variable"]
PROMETHEUS_TYPE = "prometheus"
_VARIABLE = re.compile(r"\$\{(\w+)(?::\w+)?\}|\$(\w+)|\[\[(\w+)\]\]")
_LABEL_VALUES = re.compile(r"^\s*label_values\(\s*(?:(.+?)\s*,\s*)?(\w+)\s*\)\s*$", re.DOTALL)
_REGEX_SPECIAL = re.compile(r"([\\^$.|?*+()\[\]{}])")


class DashboardError(QuantloadError):
    """A dashboard file that cannot be read, or a query naming an unknown variable."""


@dataclass(frozen=True)
class DashboardQuery:
    """One query of a dashboard: a panel target, an annotation or a template variable."""

    kind: QueryKind
    where: str  # e.g. "panel 3 'Output tokens/s' B"
    expr: str
    step: str | None = None

    @property
    def needs_gpu(self) -> bool:
        """Whether the query reads a series only a machine with an NVIDIA GPU has."""
        return GPU_PREFIX in self.expr


@dataclass(frozen=True)
class QueryCheck:
    """What one query returned: how many series and whether any value was a number."""

    query: DashboardQuery
    expr: str
    series: int
    has_number: bool
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.has_number

    def ok_without_gpu(self) -> bool:
        """A GPU query where no GPU is: it ran and honestly found no series."""
        return self.query.needs_gpu and self.error is None and self.series == 0

    def describe(self) -> str:
        """One line for a test failure or a log."""
        result = self.error or f"{self.series} series, numbers: {self.has_number}"
        return f"{self.query.where}: {result} <- {self.expr}"


def load_dashboard(path: Path) -> dict[str, Any]:
    """A dashboard JSON file as a dict."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DashboardError(f"cannot read dashboard {path}: {error}") from None
    if not isinstance(data, dict) or not isinstance(data.get("panels"), list):
        raise DashboardError(f"{path} is not a Grafana dashboard (no panels list)")
    return data


def _is_prometheus(datasource: Any, default: bool) -> bool:
    if isinstance(datasource, dict):
        return datasource.get("type") == PROMETHEUS_TYPE
    return default if datasource is None else False


def _panels(panels: list[Any]) -> Iterator[dict[str, Any]]:
    for panel in panels:
        if isinstance(panel, dict):
            yield panel
            yield from _panels(panel.get("panels", []))


def dashboard_queries(dashboard: Mapping[str, Any]) -> list[DashboardQuery]:
    """Every Prometheus query in the dashboard: panel targets, annotations, variables."""
    queries: list[DashboardQuery] = []
    for panel in _panels(list(dashboard.get("panels", []))):
        panel_is_prom = _is_prometheus(panel.get("datasource"), True)
        for target in panel.get("targets", []):
            if target.get("hide") or not target.get("expr"):
                continue
            if not _is_prometheus(target.get("datasource"), panel_is_prom):
                continue
            where = f"panel {panel.get('id')} {panel.get('title')!r} {target.get('refId')}"
            queries.append(DashboardQuery("panel", where, target["expr"]))
    for annotation in dashboard.get("annotations", {}).get("list", []):
        if annotation.get("expr") and _is_prometheus(annotation.get("datasource"), False):
            where = f"annotation {annotation.get('name')!r}"
            queries.append(DashboardQuery("annotation", where, annotation["expr"], annotation.get("step")))
    for variable in dashboard.get("templating", {}).get("list", []):
        if variable.get("type") != "query" or not _is_prometheus(variable.get("datasource"), False):
            continue
        query = variable.get("query")
        text = query.get("query") if isinstance(query, dict) else query
        if text:
            queries.append(DashboardQuery("variable", f"variable {variable.get('name')!r}", text))
    return queries


def _seconds_text(seconds: float) -> str:
    return f"{max(1, round(seconds))}s"


def _regex_escape(value: str) -> str:
    return _REGEX_SPECIAL.sub(r"\\\\\1", value)


def substitute(
    expr: str,
    selections: Mapping[str, Sequence[str] | None],
    step_s: float,
    scrape_interval_s: float,
    range_s: float,
) -> str:
    """`expr` with Grafana's variables replaced; `selections[name]` None or empty means All."""
    builtins = {
        "__interval": _seconds_text(step_s),
        "__interval_ms": str(round(step_s * 1000)),
        "__rate_interval": _seconds_text(max(step_s + scrape_interval_s, 4 * scrape_interval_s)),
        "__range": _seconds_text(range_s),
        "__range_s": str(round(range_s)),
    }

    def replace(match: re.Match[str]) -> str:
        name = match[1] or match[2] or match[3]
        if name in builtins:
            return builtins[name]
        if name not in selections:
            raise DashboardError(f"unknown variable ${name} in {expr!r}")
        values = selections[name]
        if not values:
            return ".*"
        escaped = [_regex_escape(v) for v in values]
        return escaped[0] if len(escaped) == 1 else "(" + "|".join(escaped) + ")"

    return _VARIABLE.sub(replace, expr)


def _check_one(
    client: PrometheusClient,
    query: DashboardQuery,
    expr: str,
    window: tuple[float, float, float],
) -> QueryCheck:
    start, end, step = window
    try:
        if query.kind == "variable":
            match = _LABEL_VALUES.match(expr)
            if match is None:
                raise DashboardError(f"only label_values(...) variables are checked, not {expr!r}")
            values = client.label_values(match[2], match[1])
            return QueryCheck(query, expr, len(values), bool(values))
        series = client.query_range(expr, start, end, step)
    except (PrometheusQueryError, DashboardError) as error:
        return QueryCheck(query, expr, 0, False, error.one_line())
    return QueryCheck(query, expr, len(series), any(s.has_number() for s in series))


def check_dashboard(
    client: PrometheusClient,
    dashboard: Mapping[str, Any],
    start: float,
    end: float,
    scrape_interval_s: float,
    selections: Mapping[str, Sequence[str] | None] | None = None,
    step_s: float | None = None,
) -> list[QueryCheck]:
    """Run every query of `dashboard` over [start, end]; a check per query says what came back.

    Variables not in `selections` are "All".
    """
    variables: dict[str, Sequence[str] | None] = {
        v["name"]: None for v in dashboard.get("templating", {}).get("list", []) if "name" in v
    }
    variables.update(selections or {})
    step = step_s or max(scrape_interval_s, (end - start) / 250)
    checks: list[QueryCheck] = []
    for query in dashboard_queries(dashboard):
        query_step = _parse_step(query.step) or step
        try:
            expr = substitute(query.expr, variables, query_step, scrape_interval_s, end - start)
        except DashboardError as error:
            checks.append(QueryCheck(query, query.expr, 0, False, error.one_line()))
            continue
        checks.append(_check_one(client, query, expr, (start, end, query_step)))
    return checks


def _parse_step(text: str | None) -> float | None:
    if not text:
        return None
    match = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m|h)", text.strip())
    if match is None:
        return None
    scale = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}[match[2]]
    return float(match[1]) * scale
