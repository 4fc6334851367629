"""Records built from stream results, their JSON lines, summaries and the Prometheus collector."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import generate_latest

from load_api import sweep_of
from quantload.config import LoadSettings
from quantload.load.measure import aborted_record, build_record
from quantload.load.metrics import HISTOGRAMS, LoadMetrics, new_registry
from quantload.load.prompts import Prompt
from quantload.load.records import (
    ERROR_CLASSES,
    JsonlAppender,
    RequestRecord,
    StageEvent,
    iter_records,
    iter_stage_events,
)
from quantload.load.stream_result import StreamResult
from quantload.load.summary import delivered_concurrency, summarize_stage
from quantload.load.tickets import Ticket, stage_tickets
from quantload.served import ServedTarget
from quantload.slo import Slo

TARGET = ServedTarget(name="srv", quant="Q4_K_M", model="m", url="http://127.0.0.1:1")


def ticket(timeout_s: float = 10.0) -> Ticket:
    settings = LoadSettings(users=(2,), request_timeout_s=timeout_s, max_tokens=4)
    plan = sweep_of(settings, TARGET, [Prompt("p1", "hi", 1)], "run", "inv")
    return stage_tickets(plan, plan.stages[0], warmup=False)[0]


def ok_result() -> StreamResult:
    return StreamResult(
        sent_unix_s=100.0,
        sent_perf_s=5.0,
        connect_s=0.0003,
        status=200,
        ttfb_s=0.001,
        content_times_s=[0.100, 0.120, 0.130, 0.160],
        end_s=0.170,
        done_seen=True,
        finish_reason="length",
        usage={"prompt_tokens": 9, "completion_tokens": 4, "prompt_tokens_details": {"cached_tokens": 2}},
        timings={"prompt_ms": 95.5, "predicted_ms": 60, "cache_n": 2},
    )


def test_ttft_tpot_itl_from_a_stream() -> None:
    record = build_record(ticket(), ok_result(), lag_s=0.002, worker="h:1")
    assert record.ok and record.within_deadline and record.error_class is None
    assert record.ttft_s == pytest.approx(0.100)
    assert record.e2e_s == pytest.approx(0.170)
    assert record.tpot_s == pytest.approx((0.170 - 0.100) / 3)
    assert record.itl_s == pytest.approx([0.020, 0.010, 0.030])
    assert (record.itl_count, record.itl_max_s) == (3, pytest.approx(0.030))
    assert record.itl_p50_s == pytest.approx(0.020)
    assert record.ttft_from_intended_s == pytest.approx(0.102)
    assert record.intended_unix_s == pytest.approx(99.998)
    assert (record.prompt_tokens, record.completion_tokens, record.cached_tokens) == (9, 4, 2)
    assert record.timings == {"prompt_ms": 95.5, "predicted_ms": 60.0, "cache_n": 2.0}
    assert (record.stage_users, record.experiment, record.cache_prompt) == (2, "sweep", False)


def test_goodput_counts_latency_from_the_intended_time() -> None:
    late = build_record(ticket(timeout_s=0.2), ok_result(), lag_s=0.05, worker="h:1")
    assert late.ok and not late.within_deadline


def test_failures_keep_their_class_and_no_latency() -> None:
    result = StreamResult(sent_unix_s=1.0, status=503, error_class="http_5xx", error="HTTP 503: busy")
    record = build_record(ticket(), result, lag_s=0.0, worker="h:1")
    assert not record.ok and not record.within_deadline
    assert record.error_class in ERROR_CLASSES and record.http_status == 503
    assert record.ttft_s is None and record.e2e_s is None and record.tpot_s is None
    aborted = aborted_record(ticket(), 0.0, "h:1", 2.0)
    assert aborted.error_class == "aborted" and aborted.sent_unix_s == 2.0


def test_single_token_has_no_tpot() -> None:
    result = ok_result()
    result.content_times_s = [0.1]
    result.usage = {"completion_tokens": 1}
    record = build_record(ticket(), result, 0.0, "h:1")
    assert record.tpot_s is None and record.itl_s is None and record.itl_count == 0


def test_jsonl_round_trip_and_torn_last_line(tmp_path: Path) -> None:
    path = tmp_path / "records.jsonl"
    appender = JsonlAppender(path)
    record = build_record(ticket(), ok_result(), 0.0, "h:1")
    appender.append(record)
    appender.append(record)
    appender.close()
    with path.open("a") as handle:
        handle.write('{"schema": "quantload.record/1", "run_id"')  # a crash mid-line
    records = list(iter_records(path))
    assert records == [record, record]
    assert '"schema":"quantload.record/1"' in path.read_text()


def end_event(**changes: object) -> StageEvent:
    fields: dict[str, object] = dict(
        event="stage_end", unix_s=1.0, run_id="run", server="srv", quant="Q4_K_M",
        experiment="sweep", stage_id="inv-0", stage_index=0, stage_users=2, cache_prompt=False,
        requests_planned=3, requests_done=3, requests_ok=2,
    )  # fmt: skip
    fields.update(changes)
    return StageEvent.model_validate(fields)


def test_stage_events_round_trip(tmp_path: Path) -> None:
    appender = JsonlAppender(tmp_path / "stages.jsonl")
    appender.append(end_event(status="failed", reason="3 requests in a row failed"))
    appender.close()
    (event,) = iter_stage_events(tmp_path / "stages.jsonl")
    assert event.status == "failed" and event.reason == "3 requests in a row failed"


def test_stage_summary_from_records() -> None:
    ok = build_record(ticket(), ok_result(), 0.0, "h:1")
    failed = build_record(ticket(), StreamResult(sent_unix_s=100.0, error_class="timeout"), 0.0, "h:1")
    warm = ok.model_copy(update={"warmup": True, "ttft_s": 9.0})
    other = ok.model_copy(update={"stage_id": "inv-1"})
    summary = summarize_stage(end_event(), [ok, ok, failed, warm, other], Slo(1.0, 0.1))
    assert (summary.requests, summary.ok, summary.good) == (3, 2, 2)
    assert summary.counts.failed == 1 and summary.arrival == "closed"
    strict = summarize_stage(end_event(), [ok, ok, failed], Slo(0.05, 0.1))  # TTFT 100 ms misses 50 ms
    assert (strict.good, strict.counts.ttft_over) == (0, 2)
    assert summary.errors == {"timeout": 1}
    assert summary.ttft_p50_s == pytest.approx(0.1)
    assert summary.tpot_p50_s == pytest.approx(0.07 / 3)


def test_delivered_concurrency() -> None:
    assert delivered_concurrency([(0.0, 1.0)]) is None
    # two users back to back, each always busy between the first and last send
    intervals = [(0.0, 1.0), (0.0, 1.0), (1.0, 2.0), (1.0, 2.0)]
    assert delivered_concurrency(intervals) == pytest.approx(2.0)


def test_collector_names_labels_and_no_created_series() -> None:
    metrics = LoadMetrics()
    labels = ("srv", "Q4_K_M", "sweep", "")
    metrics.observe_request(labels, "ok", 0.1, 0.02, 0.5, [0.01, 0.03], 0.001, 12, 5)
    metrics.observe_request(labels, "http_5xx", None, None, None, [], 0.0, None, None)
    metrics.observe_request(("srv", "Q4_K_M", "sweep", "acme"), "context_exceeded", None, None, None, [], 0.0,
                            None, None)  # fmt: skip
    metrics.set_active_users("srv", "Q4_K_M", 4)
    metrics.set_stage(["srv", "Q4_K_M", "sweep", "4", "1", ""])
    registry = new_registry(metrics)
    value = registry.get_sample_value
    base = {"server": "srv", "quant": "Q4_K_M", "experiment": "sweep", "tenant": ""}
    assert value("quantload_ttft_seconds_count", base) == 1
    assert value("quantload_ttft_seconds_bucket", {**base, "le": "0.1"}) == 1
    assert value("quantload_ttft_seconds_bucket", {**base, "le": "0.075"}) == 0
    assert value("quantload_itl_seconds_count", base) == 2
    assert value("quantload_client_lag_seconds_count", base) == 2
    assert value("quantload_requests_total", {**base, "outcome": "ok"}) == 1
    assert value("quantload_requests_total", {**base, "outcome": "http_5xx"}) == 1
    assert value("quantload_requests_total", {**base, "tenant": "acme", "outcome": "context_exceeded"}) == 1
    assert value("quantload_output_tokens_total", {"server": "srv", "quant": "Q4_K_M", "tenant": ""}) == 5
    assert value("quantload_prompt_tokens_total", {"server": "srv", "quant": "Q4_K_M", "tenant": ""}) == 12
    assert value("quantload_active_users", {"server": "srv", "quant": "Q4_K_M"}) == 4
    stage = {"server": "srv", "quant": "Q4_K_M", "experiment": "sweep", "users": "4", "repeat": "1", "rate_rps": ""}
    assert value("quantload_stage_info", stage) == 1
    text = generate_latest(registry).decode()
    assert "_created" not in text
    for name in HISTOGRAMS:
        assert f"# TYPE {name} histogram" in text
    metrics.set_stage(None)
    assert registry.get_sample_value("quantload_stage_info", stage) is None


def test_record_rejects_nothing_it_does_not_know() -> None:
    line = build_record(ticket(), ok_result(), 0.0, "h:1").to_json_line()
    newer = line[:-1] + ',"future_field":1}'
    assert RequestRecord.from_json_line(newer).ttft_s == pytest.approx(0.1)
