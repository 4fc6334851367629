"""The Grafana dashboards and provisioning files, checked without Grafana."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from dashboard_check import (
    DashboardError,
    check_dashboard,
    dashboard_queries,
    load_dashboard,
    substitute,
)
from quantload.exporter import names
from quantload.exporter.server_metrics import RENAMES
from quantload.observe.annotations import OVERVIEW_UID, STAGE_TAGS
from quantload.observe.promql import PrometheusClient

GRAFANA = Path(__file__).resolve().parents[3] / "grafana"
DASHBOARDS = sorted((GRAFANA / "dashboards").glob("*.json"))
OVERVIEW = GRAFANA / "dashboards" / "quantload-overview.json"
LOADGEN_METRICS = {
    "quantload_ttft_seconds",
    "quantload_tpot_seconds",
    "quantload_itl_seconds",
    "quantload_e2e_seconds",
    "quantload_client_lag_seconds",
    "quantload_requests_total",
    "quantload_output_tokens_total",
    "quantload_prompt_tokens_total",
    "quantload_active_users",
    "quantload_stage_info",
}
EXPORTER_METRICS = {value.name for value in vars(names).values() if isinstance(value, names.MetricSpec)} | {
    name for name, _ in RENAMES.values()
}


def _datasource_uid() -> str:
    provisioning = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    (source,) = provisioning["datasources"]
    assert source["type"] == "prometheus"
    return str(source["uid"])


def test_provisioning_files() -> None:
    assert _datasource_uid() == "quantload-prometheus"
    providers = yaml.safe_load((GRAFANA / "provisioning/dashboards/quantload.yml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_dashboard_structure(path: Path) -> None:
    dashboard = load_dashboard(path)
    assert re.fullmatch(r"[a-z0-9-]{1,40}", dashboard["uid"])
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    uid = _datasource_uid()
    for panel in dashboard["panels"]:
        assert panel["datasource"] == {"type": "prometheus", "uid": uid}, panel["title"]
        grid = panel["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
    for variable in dashboard["templating"]["list"]:
        assert variable["datasource"]["uid"] == uid


def test_dashboard_uids_are_unique() -> None:
    uids = [load_dashboard(path)["uid"] for path in DASHBOARDS]
    assert len(uids) == len(set(uids)) and OVERVIEW_UID in uids


def test_overview_covers_what_the_issue_asks() -> None:
    dashboard = load_dashboard(OVERVIEW)
    exprs = " ".join(query.expr for query in dashboard_queries(dashboard))
    for metric in (
        "quantload_ttft_seconds_bucket",
        "quantload_tpot_seconds_bucket",
        "quantload_output_tokens_total",
        "llamacpp_requests_processing",
        "llamacpp_requests_deferred",
        "quantload_server_slots_busy",
        "quantload_server_kv_cells_used_ratio",
        "quantload_requests_total",
        "quantload_active_users",
        "quantload_stage_info",
    ):
        assert metric in exprs, metric
    assert {v["name"] for v in dashboard["templating"]["list"]} == {"quant", "server"}
    tag_annotations = [a for a in dashboard["annotations"]["list"] if "target" in a]
    assert any(a["target"]["tags"] == list(STAGE_TAGS) for a in tag_annotations)


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_queries_name_only_metrics_that_exist(path: Path) -> None:
    for query in dashboard_queries(load_dashboard(path)):
        found = set(re.findall(r"\b(quantload_[a-z_]+|llamacpp_[a-z_]+)\b", query.expr))
        used = {re.sub(r"_(bucket|sum|count)$", "", name) for name in found}
        assert not used - LOADGEN_METRICS - EXPORTER_METRICS, query.where


@pytest.mark.parametrize("path", DASHBOARDS, ids=lambda p: p.name)
def test_every_panel_query_is_per_quant_and_substitutes(path: Path) -> None:
    dashboard = load_dashboard(path)
    variables = {v["name"]: None for v in dashboard["templating"]["list"]}
    for query in dashboard_queries(dashboard):
        expr = substitute(query.expr, variables, 2.0, 1.0, 600.0)
        assert "$" not in expr, query.where
        if query.kind == "panel" and "exporter_scrape_duration" not in expr and not query.needs_gpu:
            assert "quant" in expr, query.where


def test_the_gpu_panels_show_power_energy_utilisation_and_memory_per_gpu() -> None:
    queries = [q for q in dashboard_queries(load_dashboard(OVERVIEW)) if q.needs_gpu]
    exprs = " ".join(q.expr for q in queries)
    for spec in (names.GPU_POWER, names.GPU_ENERGY, names.GPU_UTILIZATION_RATIO, names.GPU_MEMORY_USED):
        assert spec.name in exprs, spec.name
    assert {q.where.split("'")[1] for q in queries} == {
        "GPU power and energy per output token",
        "GPU utilisation and memory",
    }


def test_substitute_like_grafana() -> None:
    expr = 'rate(x{quant=~"$quant", server=~"${server}"}[$__rate_interval]) [$__interval] $__range'
    out = substitute(expr, {"quant": ["Q8_0", "F16"], "server": None}, 2.0, 1.0, 300.0)
    assert out == 'rate(x{quant=~"(Q8_0|F16)", server=~".*"}[4s]) [2s] 300s'
    assert substitute('x{m=~"$m"}', {"m": ["qwen2.5"]}, 1, 1, 1) == 'x{m=~"qwen2\\\\.5"}'
    assert substitute("[$__rate_interval]", {}, 10.0, 1.0, 60.0) == "[11s]"
    with pytest.raises(DashboardError, match="unknown variable"):
        substitute('x{a=~"$nope"}', {}, 1, 1, 1)


def _dashboard_with(exprs: list[str]) -> dict[str, Any]:
    ds = {"type": "prometheus", "uid": "p"}
    targets = [{"refId": chr(65 + i), "expr": e, "datasource": ds} for i, e in enumerate(exprs)]
    return {"panels": [{"id": 1, "title": "t", "datasource": ds, "targets": targets}]}


def test_check_dashboard_reports_errors_and_empty_results() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        query = request.content.decode()
        if "broken" in query:
            return httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "bad"})
        result = [] if "empty" in query else [{"metric": {}, "values": [[1, "1"]]}]
        return httpx.Response(
            200, json={"status": "success", "data": {"resultType": "matrix", "result": result}}
        )

    client = PrometheusClient("http://p", transport=httpx.MockTransport(handler))
    checks = check_dashboard(client, _dashboard_with(["good", "empty", "broken(", "$undefined"]), 0, 60, 1)
    assert [check.ok for check in checks] == [True, False, False, False]
    assert "bad_data" in (checks[2].error or "")
    assert "unknown variable" in (checks[3].error or "")
    assert all(check.describe() for check in checks)


def test_load_dashboard_rejects_non_dashboards(tmp_path: Path) -> None:
    path = tmp_path / "x.json"
    path.write_text(json.dumps({"title": "no panels"}))
    with pytest.raises(DashboardError):
        load_dashboard(path)
