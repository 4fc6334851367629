"""The socket client against the fake server: streams, connection reuse, and every fault class.

Nothing here asserts how fast anything is; only causality (TTFT is never below the scripted
value, since the server cannot send the token earlier than it was told to).
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator

import pytest

from quantload.llamacpp.server import free_port
from quantload.load.client import ConnectionPool, Endpoint, EndpointError, stream_request
from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.load.openai_chunks import classify_stream


def body(text: str = "hello", max_tokens: int = 6) -> bytes:
    return json.dumps(
        {"messages": [{"role": "user", "content": text}], "stream": True, "max_tokens": max_tokens}
    ).encode()


@pytest.fixture
def server() -> Iterator[FakeServer]:
    with FakeServer(FakeScript(ttft_ms=(30, 30), itl_ms=(2, 2), tokens=6)) as fake:
        yield fake


@pytest.fixture
def closing_server() -> Iterator[FakeServer]:
    script = FakeScript(ttft_ms=(5, 5), itl_ms=(1, 1), tokens=4, close_after_stream=True)
    with FakeServer(script) as fake:
        yield fake


def test_endpoint_from_url() -> None:
    endpoint = Endpoint.from_url("http://127.0.0.1:8080/v1/", api_key="k")
    assert (endpoint.host, endpoint.port, endpoint.path) == ("127.0.0.1", 8080, "/v1/chat/completions")
    request = endpoint.request_bytes(b"{}")
    assert request.startswith(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1:8080\r\n")
    assert b"Authorization: Bearer k\r\n" in request and request.endswith(b"\r\n\r\n{}")
    assert Endpoint.from_url("https://example.org").port == 443
    with pytest.raises(EndpointError):
        Endpoint.from_url("ftp://example.org")


def test_a_stream_is_measured_past_the_pathological_chunks(server: FakeServer) -> None:
    endpoint = Endpoint.from_url(server.url)
    result = stream_request(ConnectionPool(endpoint), endpoint.request_bytes(body()), 5.0)
    assert result.ok, result.error
    assert result.status == 200 and result.done_seen and result.finish_reason == "length"
    assert len(result.content_times_s) == 6
    assert result.empty_chunks >= 2  # the role-only chunk and the empty delta did not count
    assert result.comments == 1
    assert result.timings is not None and result.usage is not None
    assert result.usage["completion_tokens"] == 6
    assert result.ttft_s is not None and result.ttft_s * 1000 >= result.timings["prompt_ms"]
    assert result.content_times_s == sorted(result.content_times_s)
    assert result.connect_s is not None and not result.connection_reused


def test_keep_alive_server_reuses_the_connection(server: FakeServer) -> None:
    endpoint = Endpoint.from_url(server.url)
    pool = ConnectionPool(endpoint)
    results = [stream_request(pool, endpoint.request_bytes(body()), 5.0) for _ in range(3)]
    assert all(r.ok for r in results)
    assert [r.connection_reused for r in results] == [False, True, True]
    assert results[1].connect_s is None
    assert server.stats.connections == 1


def test_server_closing_after_each_stream_costs_no_error(closing_server: FakeServer) -> None:
    endpoint = Endpoint.from_url(closing_server.url)
    pool = ConnectionPool(endpoint)
    results = [stream_request(pool, endpoint.request_bytes(body()), 5.0) for _ in range(4)]
    assert all(r.ok for r in results), [r.error for r in results]
    assert not any(r.connection_reused for r in results)
    assert closing_server.stats.connections == 4


@pytest.mark.parametrize(
    ("fault", "error_class", "chunks"),
    [
        ("http_500", "http_5xx", 0),
        ("http_503", "http_5xx", 0),
        ("cut_after:2", "stream_cut", 2),
        ("malformed_after:3", "malformed_chunk", 3),
        ("error_after:1", "server_error_event", 1),
        ("reset", "connect_error", 0),
    ],
)
def test_faults_become_error_classes(server: FakeServer, fault: str, error_class: str, chunks: int) -> None:
    endpoint = Endpoint.from_url(server.url)
    pool = ConnectionPool(endpoint, reuse="never")
    result = stream_request(pool, endpoint.request_bytes(body(f"x [[fake fault={fault}]]")), 5.0)
    assert result.error_class == error_class, result.error
    assert len(result.content_times_s) == chunks
    after = stream_request(pool, endpoint.request_bytes(body()), 5.0)
    assert after.ok  # the server and the pool carry on


def test_http_error_keeps_a_reusable_connection(server: FakeServer) -> None:
    endpoint = Endpoint.from_url(server.url)
    pool = ConnectionPool(endpoint)
    failed = stream_request(pool, endpoint.request_bytes(body("[[fake fault=http_503]]")), 5.0)
    assert failed.error_class == "http_5xx" and "503" in (failed.error or "")
    again = stream_request(pool, endpoint.request_bytes(body()), 5.0)
    assert again.ok and again.connection_reused


def test_refused_connection() -> None:
    endpoint = Endpoint.from_url(f"http://127.0.0.1:{free_port()}")
    result = stream_request(ConnectionPool(endpoint), endpoint.request_bytes(body()), 5.0)
    assert result.error_class == "connect_refused"


def test_a_server_that_never_answers_hits_the_deadline(server: FakeServer) -> None:
    endpoint = Endpoint.from_url(server.url)
    result = stream_request(
        ConnectionPool(endpoint), endpoint.request_bytes(body("[[fake fault=hang]]")), 0.3
    )
    assert result.error_class == "timeout"


def _answer_once_then_drop(listener: socket.socket) -> None:
    """Answer one streamed request with keep-alive headers, then drop the next request unanswered."""
    conn, _ = listener.accept()
    with conn:
        conn.recv(65536)
        events = b'data: {"choices":[{"delta":{"content":"a"},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nKeep-Alive: timeout=5\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n" % (len(events), events)
        )
        conn.recv(65536)  # the second request arrives: close without a byte of answer
    conn2, _ = listener.accept()  # the client's retry on a fresh connection
    with conn2:
        conn2.recv(65536)
        conn2.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n" + events
        )


def test_a_dead_kept_alive_connection_is_retried_once_on_a_fresh_one() -> None:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        thread = threading.Thread(target=_answer_once_then_drop, args=(listener,), daemon=True)
        thread.start()
        endpoint = Endpoint.from_url(f"http://127.0.0.1:{listener.getsockname()[1]}")
        pool = ConnectionPool(endpoint)
        first = stream_request(pool, endpoint.request_bytes(body()), 5.0)
        second = stream_request(pool, endpoint.request_bytes(body()), 5.0)
        thread.join(5)
    assert first.ok and second.ok, (first.error, second.error)
    assert second.retried_stale and not second.connection_reused
    assert pool.server_closes_streams  # learned: later requests open fresh connections


def test_classification_can_wait_until_after_the_stream(server: FakeServer) -> None:
    endpoint = Endpoint.from_url(server.url)
    pool = ConnectionPool(endpoint, reuse="never")
    raw = stream_request(pool, endpoint.request_bytes(body()), 5.0, classify=False)
    assert raw.ok and raw.events and not raw.content_times_s  # only stamped so far
    done = classify_stream(raw)
    assert done is raw and done.ok and len(done.content_times_s) == 6 and not done.events
    assert classify_stream(done) is done  # idempotent
    cut = stream_request(pool, endpoint.request_bytes(body("[[fake fault=malformed_after:2]]")), 5.0, classify=False)
    assert cut.error_class == "stream_cut"  # what the transport saw: the server hung up
    assert classify_stream(cut).error_class == "malformed_chunk"  # what really went wrong
