"""Fuzzing the readers of untrusted bytes with hypothesis, a bounded count per run (issue 16).

The targets and their properties are in `tests/fuzz_targets.py`; `benchmarks/fuzz_readers.py`
runs the same ones at random for as long as asked. Here the examples are derandomized (every run
tries the same inputs, so a red run is reproducible) and their count is QUANTLOAD_FUZZ_EXAMPLES
(default 200 per target; the loopback client target a quarter of that).
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzz_targets as targets

EXAMPLES = int(os.environ.get("QUANTLOAD_FUZZ_EXAMPLES", "200"))
BOUNDED = settings(
    max_examples=EXAMPLES,
    derandomize=True,
    database=None,
    deadline=None,  # the time bound is asserted where it matters (the client's deadline)
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@BOUNDED
@given(st.data())
def test_framing_and_sse_agree_with_the_standard_in_every_split(data: st.DataObject) -> None:
    targets.framing_and_sse_agree_with_the_reference(data)


@BOUNDED
@given(st.data())
def test_any_bytes_raise_nothing_but_protocol_errors(data: st.DataObject) -> None:
    targets.any_bytes_only_protocol_errors(data)


@BOUNDED
@given(st.data())
def test_chunk_payloads_never_raise(data: st.DataObject) -> None:
    targets.payloads_never_raise(data)


@BOUNDED
@given(st.data())
def test_stream_verdicts_are_error_classes(data: st.DataObject) -> None:
    targets.stream_verdicts_are_classes(data)


@BOUNDED
@given(st.data())
def test_metrics_reader_raises_nothing_but_server_data_errors(data: st.DataObject) -> None:
    targets.metrics_reader_only_server_data_errors(data)


@BOUNDED
@given(st.data())
def test_slots_reader_raises_nothing_but_server_data_errors(data: st.DataObject) -> None:
    targets.slots_reader_only_server_data_errors(data)


@BOUNDED
@given(st.data())
def test_json_list_reader_agrees_with_json_loads(data: st.DataObject) -> None:
    targets.json_list_reader_agrees_with_json_loads(data)


@pytest.fixture(scope="module")
def answer_server() -> Iterator[targets.OneAnswerServer]:
    server = targets.OneAnswerServer()
    yield server
    server.close()


@settings(BOUNDED, max_examples=max(EXAMPLES // 4, 1))
@given(data=st.data())
def test_the_client_returns_an_error_class_in_time(
    answer_server: targets.OneAnswerServer, data: st.DataObject
) -> None:
    targets.client_returns_a_class(answer_server, data)


def test_the_reference_reads_the_standard_s_examples() -> None:
    """The oracle itself, on the SSE standard's own cases."""
    assert targets.reference_payloads(b"data: YHOO\ndata: +2\ndata: 10\n\n") == [b"YHOO\n+2\n10"]
    assert targets.reference_payloads(b": test stream\n\ndata: first event\nid: 1\n\ndata:second\n\n") == [
        b"first event",
        b"second",
    ]
    # "the first block fires an event with empty data ..., the middle block a single newline"
    assert targets.reference_payloads(b"data\n\ndata\ndata\n\ndata:") == [b"", b"\n"]
    assert targets.reference_payloads(b"data:test\r\rdata: x\r\n\r\n") == [b"test", b"x"]
