"""The HTTP/1.1 + SSE stream parser, fed in every possible split."""

from __future__ import annotations

import json

import pytest

from quantload.load.http1 import ProtocolError, parse_head
from quantload.load.openai_chunks import classify_payload
from quantload.load.sse import EventStreamParser


def chunked(*events: bytes) -> bytes:
    return b"".join(b"%x\r\n%s\r\n" % (len(e), e) for e in events) + b"0\r\n\r\n"


HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
EVENTS = (
    b'data: {"choices":[{"delta":{"role":"assistant","content":null}}]}\n\n',
    b": keep-alive\n\n",
    b'data: {"choices": [{"delta": {"content": ""}}]}\n\n',
    b'data: {"choices":[{"delta":{"content":"Hel"}}]}\n\ndata: {"choices": [{"delta": {"content": "lo"}}]}\n\n',
    b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\n',
    b'data: {"choices":[],"usage":{"completion_tokens":2},"timings":{"prompt_ms":5.0}}\n\n',
    b"data: [DONE]\n\n",
)
STREAM = HEAD + chunked(*EVENTS)


def feed_in_pieces(raw: bytes, size: int) -> tuple[EventStreamParser, list[bytes]]:
    parser = EventStreamParser()
    payloads: list[bytes] = []
    for start in range(0, len(raw), size):
        payloads += parser.feed(raw[start : start + size])
    return parser, payloads


@pytest.mark.parametrize("size", [1, 2, 3, 7, 64, 100_000])
def test_every_split_gives_the_same_events(size: int) -> None:
    parser, payloads = feed_in_pieces(STREAM, size)
    assert parser.complete
    assert parser.head is not None and parser.head.status == 200 and parser.head.chunked
    assert parser.comments == 1
    kinds = [classify_payload(p).kind for p in payloads]
    assert kinds == ["empty", "empty", "content", "content", "empty", "empty", "done"]


def test_role_only_empty_and_whitespace_variants_are_classified() -> None:
    assert classify_payload(b'{"choices":[{"delta":{"role":"assistant","content":null}}]}').kind == "empty"
    assert classify_payload(b'{"choices":[{"delta":{"content":""}}]}').kind == "empty"
    assert classify_payload(b'{ "choices" : [ { "delta" : { "content" : "x" } } ] }').kind == "content"
    assert classify_payload(b'{"choices":[{"delta":{"reasoning_content":"hmm"}}]}').kind == "content"
    assert classify_payload(b'{"choices":[{"text":"legacy"}]}').kind == "content"
    assert classify_payload(b'{"choices":[]}').kind == "empty"
    assert classify_payload(b" [DONE] ").kind == "done"


def test_final_chunk_carries_usage_timings_and_finish_reason() -> None:
    info = classify_payload(EVENTS[5][6:-2])
    assert info.usage == {"completion_tokens": 2}
    assert info.timings == {"prompt_ms": 5.0}
    assert classify_payload(EVENTS[4][6:-2]).finish_reason == "stop"


def test_malformed_and_error_payloads() -> None:
    assert classify_payload(b'{"choices": [{"delta": {"content": "x"').kind == "malformed"
    assert classify_payload(b"[1, 2]").kind == "malformed"
    error = classify_payload(b'{"error": {"code": 500, "message": "boom"}}')
    assert error.kind == "error" and error.error == "boom"


def test_content_length_body_and_crlf_lines() -> None:
    body = b'data: {"choices":[{"delta":{"content":"a"}}]}\r\n\r\ndata: [DONE]\r\n\r\n'
    raw = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    parser, payloads = feed_in_pieces(raw, 5)
    assert parser.complete
    assert [classify_payload(p).kind for p in payloads] == ["content", "done"]


def test_body_until_close_completes_on_eof() -> None:
    raw = b"HTTP/1.0 200 OK\r\n\r\n" + b'data: {"choices":[{"delta":{"content":"a"}}]}\n\ndata: [DONE]'
    parser, payloads = feed_in_pieces(raw, 10)
    assert not parser.complete
    payloads += parser.feed_eof()
    assert parser.complete
    assert [classify_payload(p).kind for p in payloads] == ["content", "done"]
    assert parser.head is not None and not parser.head.keep_alive


def test_multiline_data_is_joined() -> None:
    raw = HEAD + chunked(b'data: {"choices":\ndata: [{"delta":{"content":"x"}}]}\n\n')
    _, payloads = feed_in_pieces(raw, 4)
    assert json.loads(payloads[0])["choices"][0]["delta"]["content"] == "x"


def test_error_status_keeps_the_body_instead_of_events() -> None:
    body = b'{"error":{"code":503,"message":"Loading model"}}'
    raw = b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    parser, payloads = feed_in_pieces(raw, 3)
    assert payloads == []
    assert parser.complete and bytes(parser.error_body) == body


def test_interim_100_continue_is_skipped() -> None:
    parser, payloads = feed_in_pieces(b"HTTP/1.1 100 Continue\r\n\r\n" + STREAM, 9)
    assert parser.head is not None and parser.head.status == 200
    assert len(payloads) == 7


@pytest.mark.parametrize(
    "raw",
    [
        b"NOPE 200 OK\r\n\r\n",
        b"HTTP/1.1 abc OK\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n2\r\nabXY",
    ],
)
def test_broken_framing_raises_protocol_error(raw: bytes) -> None:
    with pytest.raises(ProtocolError):
        EventStreamParser().feed(raw)


def test_head_keep_alive_rules() -> None:
    assert parse_head(b"HTTP/1.1 200 OK\r\nKeep-Alive: timeout=5").keep_alive
    assert not parse_head(b"HTTP/1.1 200 OK\r\nConnection: close").keep_alive
    assert parse_head(b"HTTP/1.0 200 OK\r\nConnection: keep-alive").keep_alive
