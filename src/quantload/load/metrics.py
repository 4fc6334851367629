"""Prometheus metrics of the load generator, served by each Locust process on its own port.

Names (the dashboards and recording rules are written against them):

  quantload_ttft_seconds, quantload_tpot_seconds, quantload_itl_seconds,
  quantload_e2e_seconds, quantload_client_lag_seconds       histograms {server, quant, experiment,
                                                             tenant}
  quantload_requests_total                                  counter {server, quant, experiment,
                                                             tenant, outcome}
  quantload_output_tokens_total, quantload_prompt_tokens_total   counters {server, quant, tenant}
  quantload_active_users                                    gauge {server, quant}
  quantload_stage_info                                      gauge {server, quant, experiment, users,
                                                             repeat, rate_rps}: 1 while a stage runs

`outcome` is "ok" or the record's error class; `tenant` the request's tenant ([[tenants]]), ""
for traffic of no tenant. `client_lag` is how late each request was sent
against its intended time (open loop: the Poisson schedule; closed loop: the moment the user took
the request), so a saturated client shows up as a growing lag. Warm-up requests are not counted.
`rate_rps` is "" for closed-loop stages.

Distributed mode: request metrics live where requests are sent, so every Locust worker serves its
own /metrics (port = base + 1 + worker number) and Prometheus sums across them (`sum by`);
the driving process (local runner or master) serves the base port with `quantload_active_users`
and `quantload_stage_info`, which are therefore never double counted. In one-process mode
everything is on the base port.

The collector keeps its own state and registers in a `CollectorRegistry` made for it (never the
global default registry), and emits no `_created` series.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.metrics_core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

BUCKETS_S: tuple[float, ...] = (
    0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05, 0.075,
    0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0, 5.0, 7.5,
    10.0, 15.0, 20.0, 30.0, 45.0, 60.0,
)  # fmt: skip
HISTOGRAMS: dict[str, str] = {
    "quantload_ttft_seconds": "Time from sending a request to the first chunk with generated text.",
    "quantload_tpot_seconds": "Time per output token after the first: (e2e - ttft) / (tokens - 1).",
    "quantload_itl_seconds": "Gap between consecutive chunks with generated text.",
    "quantload_e2e_seconds": "Time from sending a request to the end of its stream.",
    "quantload_client_lag_seconds": "How late the client sent a request against its intended time.",
}
REQUEST_LABELS = ("server", "quant", "experiment", "tenant")
STAGE_LABELS = ("server", "quant", "experiment", "users", "repeat", "rate_rps")


@dataclass
class _Histogram:
    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))
    total: float = 0.0
    n: int = 0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(BUCKETS_S, value)] += 1
        self.total += value
        self.n += 1

    def cumulative(self) -> list[tuple[str, float]]:
        running, out = 0, []
        for bound, count in zip([*BUCKETS_S, float("inf")], self.counts, strict=True):
            running += count
            out.append(("+Inf" if bound == float("inf") else repr(bound), float(running)))
        return out


class LoadMetrics(Collector):
    """Histograms, counters and gauges of one load process, exposed on every scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._hist: dict[str, dict[tuple[str, ...], _Histogram]] = {name: {} for name in HISTOGRAMS}
        self._requests: dict[tuple[str, ...], int] = {}
        self._output_tokens: dict[tuple[str, str, str], int] = {}
        self._prompt_tokens: dict[tuple[str, str, str], int] = {}
        self._active_users: dict[tuple[str, str], int] = {}
        self._stage: tuple[str, ...] | None = None

    def observe_request(
        self,
        labels: tuple[str, str, str, str],
        outcome: str,
        ttft_s: float | None,
        tpot_s: float | None,
        e2e_s: float | None,
        itl_s: Iterable[float],
        lag_s: float,
        prompt_tokens: int | None,
        completion_tokens: int | None,
    ) -> None:
        """Count one finished request; `labels` = (server, quant, experiment, tenant)."""
        with self._lock:
            for name, value in (
                ("quantload_ttft_seconds", ttft_s),
                ("quantload_tpot_seconds", tpot_s),
                ("quantload_e2e_seconds", e2e_s),
                ("quantload_client_lag_seconds", max(lag_s, 0.0)),
            ):
                if value is not None:
                    self._hist[name].setdefault(labels, _Histogram()).observe(value)
            itl = self._hist["quantload_itl_seconds"]
            for gap in itl_s:
                itl.setdefault(labels, _Histogram()).observe(gap)
            key = (*labels, outcome)
            self._requests[key] = self._requests.get(key, 0) + 1
            pair = (labels[0], labels[1], labels[3])
            if completion_tokens:
                self._output_tokens[pair] = self._output_tokens.get(pair, 0) + completion_tokens
            if prompt_tokens:
                self._prompt_tokens[pair] = self._prompt_tokens.get(pair, 0) + prompt_tokens

    def set_active_users(self, server: str, quant: str, users: int) -> None:
        """The number of users running now against (server, quant)."""
        with self._lock:
            self._active_users[(server, quant)] = users

    def set_stage(self, labels: Sequence[str] | None) -> None:
        """The running stage's labels (STAGE_LABELS order), or None between stages."""
        with self._lock:
            self._stage = tuple(labels) if labels is not None else None

    def collect(self) -> Iterable[Metric]:
        with self._lock:
            for name, doc in HISTOGRAMS.items():
                family = HistogramMetricFamily(name, doc, labels=REQUEST_LABELS)
                for labels, hist in sorted(self._hist[name].items()):
                    family.add_metric(list(labels), hist.cumulative(), sum_value=hist.total)
                yield family
            requests = CounterMetricFamily(
                "quantload_requests_total",
                "Requests finished, by outcome (ok or error class); warm-ups excluded.",
                labels=(*REQUEST_LABELS, "outcome"),
            )
            for key, count in sorted(self._requests.items()):
                requests.add_metric(list(key), count)
            yield requests
            for name, doc, values in (
                (
                    "quantload_output_tokens_total",
                    "Completion tokens (server usage).",
                    self._output_tokens,
                ),
                (
                    "quantload_prompt_tokens_total",
                    "Prompt tokens (server usage).",
                    self._prompt_tokens,
                ),
            ):
                counter = CounterMetricFamily(name, doc, labels=("server", "quant", "tenant"))
                for key, count in sorted(values.items()):
                    counter.add_metric(list(key), count)
                yield counter
            users = GaugeMetricFamily(
                "quantload_active_users", "Users running now.", labels=("server", "quant")
            )
            for pair, count in sorted(self._active_users.items()):
                users.add_metric(list(pair), count)
            yield users
            stage = GaugeMetricFamily(
                "quantload_stage_info", "1 while a load stage runs.", labels=STAGE_LABELS
            )
            if self._stage is not None:
                stage.add_metric(list(self._stage), 1)
            yield stage


def new_registry(metrics: LoadMetrics) -> CollectorRegistry:
    """A registry holding only `metrics`."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(metrics)
    return registry


def serve_metrics(metrics: LoadMetrics, host: str, port: int) -> int:
    """Serve /metrics on host:port (0 = any free port) in a background thread; return the port."""
    server, _thread = start_http_server(port, addr=host, registry=new_registry(metrics))
    return int(server.server_address[1])
