"""The stream reader's edge cases (issue 16, item 6) and streaming over TLS with reuse (item 5).

Each answer is written byte for byte by a scripted socket server on loopback, so the client meets
exactly the bytes a misbehaving server or proxy would send. Nothing here asserts a speed; the
time bounds only tell "answered by its own framing" from "waited for the deadline".
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator, Sequence

import pytest

from quantload.load.client import ConnectionPool, Endpoint, stream_request
from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.load.http1 import MAX_TRAILER_BYTES, ProtocolError
from quantload.load.openai_chunks import classify_payload, classify_stream
from quantload.load.sse import MAX_EVENT_BYTES, EventStreamParser, SseSplitter
from quantload.load.stream_result import StreamResult

CONTENT = b'data: {"choices":[{"delta":{"content":"hi"}}]}'
FINISH = b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}'
DONE = b"data: [DONE]"
SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"


class ScriptedServer:
    """Answers each connection's request with the next scripted bytes, then closes it."""

    def __init__(self, answers: Sequence[bytes], hold_s: float = 0.0) -> None:
        self.answers = list(answers)
        self.hold_s = hold_s  # keep the connection open this long after answering
        self.requests: list[bytes] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._thread = threading.Thread(target=self._serve, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._listener.getsockname()[1]}"

    def _serve(self) -> None:
        for answer in self.answers:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5)
                request = b""
                while b"\r\n\r\n" not in request:
                    data = conn.recv(65536)
                    if not data:
                        break
                    request += data
                self.requests.append(request)
                conn.sendall(answer)
                time.sleep(self.hold_s)

    def __enter__(self) -> ScriptedServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._listener.close()
        self._thread.join(10)


def ask(url: str, timeout_s: float = 20.0, first_byte_timeout_s: float | None = None):  # type: ignore[no-untyped-def]
    endpoint = Endpoint.from_url(url)
    pool = ConnectionPool(endpoint, reuse="never", first_byte_timeout_s=first_byte_timeout_s)
    started = time.monotonic()
    result = stream_request(pool, endpoint.request_bytes(b'{"stream": true}'), timeout_s)
    return result, time.monotonic() - started


def test_the_request_asks_for_an_uncompressed_event_stream() -> None:
    request = Endpoint.from_url("http://127.0.0.1:1").request_bytes(b"{}")
    assert b"\r\nAccept: text/event-stream\r\n" in request
    assert b"\r\nAccept-Encoding: identity\r\n" in request


def test_a_non_streaming_json_answer_is_not_streamed_with_its_finish_reason() -> None:
    body = json.dumps(
        {"object": "chat.completion", "choices": [{"message": {"content": "hi"}, "finish_reason": "stop"}]}
    ).encode()
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    with ScriptedServer([answer]) as server:
        result, _ = ask(server.url)
    assert result.error_class == "not_streamed", result.error
    assert "finish_reason stop" in (result.error or "") and "stream" in (result.error or "")


def test_a_json_error_with_status_200_is_a_server_error() -> None:
    body = b'{"error": {"message": "context too long"}}'
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (
        len(body),
        body,
    )
    with ScriptedServer([answer]) as server:
        result, _ = ask(server.url)
    assert result.error_class == "server_error_event" and "context too long" in (result.error or "")


def test_another_content_type_is_not_streamed() -> None:
    answer = b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 13\r\n\r\n<html></html>"
    with ScriptedServer([answer]) as server:
        result, _ = ask(server.url)
    assert result.error_class == "not_streamed" and "text/html" in (result.error or "")


def test_a_gzip_stream_is_a_protocol_error_not_a_cut_stream() -> None:
    answer = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nContent-Encoding: gzip\r\n"
        b"Content-Length: 4\r\n\r\n\x1f\x8b\x08\x00"
    )
    with ScriptedServer([answer]) as server:
        result, _ = ask(server.url)
    assert result.error_class == "protocol_error" and "gzip" in (result.error or "")


def test_cr_only_line_ends_are_event_stream_line_ends() -> None:
    body = CONTENT + b"\r\r" + FINISH + b"\r\r" + DONE + b"\r\r"
    with ScriptedServer([SSE_HEAD + body]) as server:
        result, _ = ask(server.url)
    assert result.ok, result.error
    assert len(result.content_times_s) == 1 and result.done_seen and result.finish_reason == "stop"


@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_cr_lf_split_across_reads_is_one_line_end(size: int) -> None:
    splitter = SseSplitter()
    raw = CONTENT + b"\r\n\r\n" + DONE + b"\r\n\r\n" + b"data: x\r\rdata: y\r\n\r\n"
    payloads: list[bytes] = []
    for start in range(0, len(raw), size):
        payloads += splitter.feed(raw[start : start + size])
    payloads += splitter.finish()
    assert payloads == [CONTENT[6:], b"[DONE]", b"x", b"y"]


def test_an_empty_data_event_does_not_fail_the_request() -> None:
    body = b"data:\n\n" + b"data: \n\n" + CONTENT + b"\n\n" + b"data:\ndata:\n\n" + FINISH + b"\n\n" + DONE + b"\n\n"
    with ScriptedServer([SSE_HEAD + body]) as server:
        result, _ = ask(server.url)
    assert result.ok, result.error
    assert len(result.content_times_s) == 1


def test_a_204_without_a_length_ends_at_once() -> None:
    with ScriptedServer([b"HTTP/1.1 204 No Content\r\n\r\n"], hold_s=2.0) as server:
        result, took_s = ask(server.url, timeout_s=20.0)
    assert result.error_class == "not_streamed" and "204" in (result.error or "")
    assert took_s < 1.5  # answered by its framing, not by the server hanging up 2 s later


def test_lf_only_response_headers_finish() -> None:
    answer = b"HTTP/1.1 200 OK\nContent-Type: text/event-stream\nConnection: close\n\n"
    answer += CONTENT + b"\n\n" + FINISH + b"\n\n" + DONE + b"\n\n"
    with ScriptedServer([answer]) as server:
        result, _ = ask(server.url)
    assert result.ok, result.error
    assert result.status == 200 and len(result.content_times_s) == 1


def test_lf_only_chunked_framing_is_read() -> None:
    events = CONTENT + b"\n\n" + DONE + b"\n\n"
    raw = b"HTTP/1.1 200 OK\nTransfer-Encoding: chunked\n\n%x\n%s\n0\n\n" % (len(events), events)
    parser = EventStreamParser()
    payloads = [p for i in range(len(raw)) for p in parser.feed(raw[i : i + 1])]
    assert parser.complete and [classify_payload(p).kind for p in payloads] == ["content", "done"]


def test_a_trailer_without_end_is_capped() -> None:
    parser = EventStreamParser()
    parser.feed(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n")
    with pytest.raises(ProtocolError, match="trailer"):
        for _ in range(MAX_TRAILER_BYTES // 100 + 2):
            parser.feed(b"X-Pad: " + b"p" * 91 + b"\r\n")


def test_an_event_without_end_is_capped() -> None:
    parser = EventStreamParser()
    parser.feed(SSE_HEAD)
    line = b"data: " + b"x" * 65536 + b"\n"
    with pytest.raises(ProtocolError, match="event"):
        for _ in range(MAX_EVENT_BYTES // 65536 + 2):
            parser.feed(line)


def test_an_unfinished_last_event_is_not_delivered_at_eof() -> None:
    body = CONTENT + b"\n\n" + DONE  # no blank line after [DONE]: the stream was cut inside it
    with ScriptedServer([SSE_HEAD + body]) as server:
        result, _ = ask(server.url)
    assert result.error_class == "stream_cut", result.error
    assert not result.done_seen


def test_a_silent_server_costs_the_first_byte_timeout_not_the_deadline() -> None:
    with FakeServer(FakeScript(ttft_ms=(5, 5), itl_ms=(1, 1), tokens=2)) as fake:
        endpoint = Endpoint.from_url(fake.url)
        pool = ConnectionPool(endpoint, reuse="never", first_byte_timeout_s=0.5)
        started = time.monotonic()
        silent = stream_request(pool, endpoint.request_bytes(b'{"stream": true, "messages": '
                                b'[{"role": "user", "content": "[[fake fault=hang]]"}]}'), 60.0)
        took_s = time.monotonic() - started
        fine = stream_request(pool, endpoint.request_bytes(b'{"stream": true, "messages": []}'), 60.0)
    assert silent.error_class == "timeout" and "first_byte_timeout_s" in (silent.error or "")
    assert took_s < 10.0
    assert fine.ok, fine.error  # a server that answers in time is not hurried by the limit


# ----------------------------------------------------------------------------------------- TLS


@pytest.fixture(scope="module")
def tls_contexts() -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """A server context with a certificate for 127.0.0.1, and a client context trusting it."""
    trustme = pytest.importorskip("trustme")
    authority = trustme.CA()
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    authority.issue_cert("127.0.0.1").configure_cert(server)
    client = ssl.create_default_context()
    authority.configure_trust(client)
    return server, client


@pytest.fixture
def tls_server(tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext]) -> Iterator[FakeServer]:
    script = FakeScript(ttft_ms=(5, 5), itl_ms=(1, 1), tokens=5)
    with FakeServer(script, ssl_context=tls_contexts[0]) as fake:
        yield fake


def test_streaming_over_tls_reuses_the_connection(
    tls_server: FakeServer, tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext]
) -> None:
    endpoint = Endpoint.from_url(tls_server.url)
    assert endpoint.scheme == "https"
    pool = ConnectionPool(endpoint, ssl_context=tls_contexts[1])
    body = b'{"stream": true, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5}'
    results = [stream_request(pool, endpoint.request_bytes(body), 10.0) for _ in range(6)]
    assert [r.error for r in results] == [None] * 6
    assert [r.connection_reused for r in results] == [False] + [True] * 5
    assert all(len(r.content_times_s) == 5 for r in results)
    assert tls_server.stats.connections == 1


def test_a_tls_connection_the_server_closed_is_not_reused(
    tls_contexts: tuple[ssl.SSLContext, ssl.SSLContext],
) -> None:
    script = FakeScript(ttft_ms=(5, 5), itl_ms=(1, 1), tokens=3, close_after_stream=True)
    with FakeServer(script, ssl_context=tls_contexts[0]) as fake:
        endpoint = Endpoint.from_url(fake.url)
        pool = ConnectionPool(endpoint, ssl_context=tls_contexts[1])
        body = b'{"stream": true, "messages": [], "max_tokens": 3}'
        results = [stream_request(pool, endpoint.request_bytes(body), 10.0) for _ in range(4)]
    assert [r.error for r in results] == [None] * 4
    assert not any(r.connection_reused for r in results)
    assert fake.stats.connections == 4


def test_json_nested_too_deep_is_a_malformed_chunk_not_a_crash() -> None:
    deep = b"[" * 5000 + b"]" * 5000
    nested_error = b'{"error": ' + b"[" * 1000 + b"]" * 1000 + b"}"
    nested_call = b'{"choices":[{"delta":{"tool_calls":[' + b"[" * 1000 + b"]" * 1000 + b"]}}]}"
    for payload in (deep, nested_error, nested_call):
        assert classify_payload(payload).kind == "malformed"
    result = StreamResult(events=[(0.01, CONTENT[6:]), (0.02, nested_error), (0.03, b"[DONE]")])
    assert classify_stream(result).error_class == "malformed_chunk"


@pytest.mark.parametrize("key", ["sk-1\r\nX-Forged: 1", "sk-\x00", "ключ"])
def test_an_api_key_no_header_can_carry_is_refused_without_showing_it(key: str) -> None:
    from pydantic import SecretStr

    from quantload.errors import ConfigError
    from quantload.load.client import EndpointError
    from quantload.served import ServedTarget

    with pytest.raises(ConfigError) as refused:
        ServedTarget(name="s", url="http://127.0.0.1:8080", api_key=SecretStr(key))
    assert key not in refused.value.one_line()
    with pytest.raises(EndpointError):
        Endpoint.from_url("http://127.0.0.1:8080", api_key=key)
