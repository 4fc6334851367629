"""The Prometheus HTTP API client, against a mock transport."""

from __future__ import annotations

import math
from urllib.parse import parse_qs

import httpx
import pytest

from quantload.observe.promql import PrometheusClient, PrometheusQueryError


def _client(handler: object) -> PrometheusClient:
    return PrometheusClient("http://prom:9090/", transport=httpx.MockTransport(handler))  # type: ignore[arg-type]


def test_range_query_posts_a_form_and_reads_a_matrix() -> None:
    seen: dict[str, list[str]] = {}

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.method == "POST" and request.url.path == "/api/v1/query_range"
        seen.update(parse_qs(request.content.decode()))
        return httpx.Response(
            200,
            json={
                "status": "success",
                "data": {
                    "resultType": "matrix",
                    "result": [{"metric": {"quant": "Q8_0"}, "values": [[1.0, "0.5"], [2.0, "NaN"]]}],
                },
            },
        )

    series = _client(handler).query_range('sum by (quant) (x{a="b"})', 1.0, 2.0, 1.0)
    assert seen["query"] == ['sum by (quant) (x{a="b"})'] and seen["step"] == ["1"]
    assert series[0].labels == {"quant": "Q8_0"}
    assert series[0].values()[0] == 0.5 and math.isnan(series[0].values()[1])
    assert series[0].has_number()


def test_instant_query_reads_vectors_and_scalars() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        query = parse_qs(request.content.decode())["query"][0]
        if query == "1":
            data = {"resultType": "scalar", "result": [5.0, "1"]}
        else:
            data = {"resultType": "vector", "result": [{"metric": {}, "value": [5.0, "NaN"]}]}
        return httpx.Response(200, json={"status": "success", "data": data})

    client = _client(handler)
    assert client.query("1")[0].points == [(5.0, 1.0)]
    assert not client.query("x", at=5.0)[0].has_number()


def test_refused_queries_and_unreachable_servers_raise() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        return httpx.Response(400, json={"status": "error", "errorType": "bad_data", "error": "parse error"})

    with pytest.raises(PrometheusQueryError, match="bad_data: parse error"):
        _client(refuse).query("sum(")

    def down(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused")

    with pytest.raises(PrometheusQueryError, match="not reachable"):
        _client(down).query("up")


def test_too_many_points_are_refused_before_asking() -> None:
    with pytest.raises(PrometheusQueryError, match="over Prometheus"):
        _client(lambda r: httpx.Response(500)).query_range("up", 0, 100_000, 1)


def test_label_values_with_a_match() -> None:
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/label/quant/values"
        assert request.url.params["match[]"] == "quantload_target_up"
        return httpx.Response(200, json={"status": "success", "data": ["F16", "Q8_0"]})

    assert _client(handler).label_values("quant", "quantload_target_up") == ["F16", "Q8_0"]
