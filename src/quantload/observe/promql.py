"""A small client for Prometheus' HTTP API: instant and range queries, label values."""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import httpx

from quantload.errors import QuantloadError
from quantload.http_errors import said

MAX_POINTS = 11_000  # Prometheus refuses range queries with more points per series


class PrometheusQueryError(QuantloadError):
    """Prometheus was not reachable, or refused or failed a query."""


@dataclass(frozen=True)
class Series:
    """One result series: its labels and (unix seconds, value) points."""

    labels: dict[str, str]
    points: list[tuple[float, float]]

    def values(self) -> list[float]:
        """The values, NaN included."""
        return [value for _, value in self.points]

    def has_number(self) -> bool:
        """True when at least one value is a finite number."""
        return any(math.isfinite(value) for value in self.values())


def _series(data: dict[str, Any]) -> list[Series]:
    kind: Any = data.get("resultType")
    result: Any = data.get("result")
    if kind in ("scalar", "string"):
        return [Series({}, [(float(result[0]), float(result[1]))])] if kind == "scalar" else []
    if kind == "vector":
        return [
            Series(item["metric"], [(float(item["value"][0]), float(item["value"][1]))]) for item in result
        ]
    if kind == "matrix":
        return [Series(item["metric"], [(float(t), float(v)) for t, v in item["values"]]) for item in result]
    raise PrometheusQueryError(f"unexpected result type {kind!r} from Prometheus")


class PrometheusClient:
    """Queries one Prometheus server. Use as a context manager, or call close()."""

    def __init__(
        self, url: str, timeout_s: float = 10.0, transport: httpx.BaseTransport | None = None
    ) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.Client(timeout=timeout_s, transport=transport)

    def _call(self, path: str, form: dict[str, str] | None = None, match: str | None = None) -> Any:
        """POST `form` to `path` (GET with `match[]` when `form` is None); the answer's data."""
        try:
            if form is None:
                params = {"match[]": match} if match else None
                response = self._client.get(f"{self.url}{path}", params=params)
            else:
                response = self._client.post(f"{self.url}{path}", data=form)
        except httpx.HTTPError as error:
            raise PrometheusQueryError(
                f"Prometheus at {self.url} is not reachable: {said(error)}",
                "is it running? (native mode starts it; compose: `docker compose up prometheus`)",
            ) from None
        try:
            body = response.json()
        except ValueError:
            raise PrometheusQueryError(
                f"Prometheus answered HTTP {response.status_code} without JSON on {path}"
            ) from None
        if body.get("status") != "success":
            raise PrometheusQueryError(
                f"Prometheus refused the query: {body.get('errorType')}: {body.get('error')}"
            )
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Series]:
        """Evaluate `expr` at one instant (now when `at` is None)."""
        form = {"query": expr}
        if at is not None:
            form["time"] = f"{at:.3f}"
        return _series(self._call("/api/v1/query", form))

    def query_range(self, expr: str, start: float, end: float, step_s: float) -> list[Series]:
        """Evaluate `expr` every `step_s` seconds from `start` to `end` (unix seconds)."""
        if step_s <= 0 or end < start:
            raise PrometheusQueryError("a range query needs start <= end and a positive step")
        if (end - start) / step_s > MAX_POINTS:
            raise PrometheusQueryError(
                f"{(end - start) / step_s:.0f} points per series is over Prometheus' {MAX_POINTS}",
                "use a larger step",
            )
        form = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step_s:g}"}
        return _series(self._call("/api/v1/query_range", form))

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        """Values `label` takes, optionally only on series matching the selector `match`."""
        data = self._call(f"/api/v1/label/{label}/values", None, match)
        return [str(value) for value in data]

    def close(self) -> None:
        """Close the connection pool."""
        self._client.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
