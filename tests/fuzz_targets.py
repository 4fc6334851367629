"""What the fuzz tests throw at quantload's readers of untrusted bytes, and what must hold.

Shared by `tests/unit/test_fuzz_readers.py` (a bounded, derandomized count on every test run) and
`benchmarks/fuzz_readers.py` (random, as long as asked). Each target is a function of hypothesis'
`data` object; it draws its input and asserts the properties:

- the stream reader (HTTP/1.1 framing, chunked, SSE, `quantload.load.sse`/`http1`) raises nothing
  but `ProtocolError`, whatever the bytes and however they are split across reads; what it holds
  stays bounded by its caps; a well-formed response gives, in every split, exactly the payloads a
  plain reference reading of the SSE standard gives (`reference_payloads`);
- the OpenAI chunk layer (`classify_payload`, `classify_stream`) never raises, and a stream's
  verdict is ok or one of the record error classes;
- the whole client (`stream_request`) against a loopback server sending those bytes returns a
  result (never raises) before its deadline;
- llama-server's `/metrics` and `/slots` readers raise nothing but `ServerDataError`.

Test code: nothing here ships in the package.
"""

from __future__ import annotations

import json
import re
import socket
import threading
import time
from typing import Any

from hypothesis import strategies as st

from quantload.exporter.server_metrics import ServerDataError, parse_server_metrics
from quantload.exporter.slots import parse_slots
from quantload.load.client import ConnectionPool, Endpoint, stream_request
from quantload.load.http1 import MAX_HEAD_BYTES, MAX_TRAILER_BYTES, ProtocolError
from quantload.load.openai_chunks import ChunkInfo, classify_payload, classify_stream
from quantload.load.records import ERROR_CLASSES
from quantload.load.sse import MAX_EVENT_BYTES, MAX_KEPT_BODY_BYTES, EventStreamParser
from quantload.load.stream_result import StreamResult

LINE_ENDS = (b"\r\n", b"\n", b"\r")
CHUNK_KINDS = ("content", "empty", "done", "error", "malformed")

# ------------------------------------------------------------------------- building blocks

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=20,
)


@st.composite
def chat_payloads(draw: st.DrawFn) -> bytes:
    """What an OpenAI-style stream's data lines carry, and the odd things servers put there."""
    kind = draw(st.sampled_from(["content", "role", "finish", "usage", "done", "error", "json", "junk", "deep"]))
    if kind == "done":
        return b"[DONE]"
    if kind == "junk":
        return draw(st.binary(max_size=60))
    if kind == "deep":
        depth = draw(st.integers(min_value=500, max_value=5000))
        return b'{"error":' + b"[" * depth + b"]" * depth + b"}"
    if kind == "json":
        return json.dumps(draw(json_values)).encode()
    delta: dict[str, Any] = {}
    choice: dict[str, Any] = {"index": 0, "delta": delta}
    obj: dict[str, Any] = {"choices": [choice]}
    if kind == "content":
        delta[draw(st.sampled_from(["content", "reasoning_content", "reasoning"]))] = draw(st.text(max_size=12))
    elif kind == "role":
        delta.update(role="assistant", content=None)
    elif kind == "finish":
        choice["finish_reason"] = draw(st.sampled_from(["stop", "length", "tool_calls"]))
    elif kind == "usage":
        obj = {"choices": [], "usage": {"completion_tokens": draw(st.integers(0, 10**6))}, "timings": {"prompt_ms": 1.5}}
    else:  # error
        obj = {"error": {"code": 500, "message": draw(st.text(max_size=30))}}
    spaced = draw(st.booleans())
    return json.dumps(obj, separators=(", ", ": ") if spaced else (",", ":")).encode()


@st.composite
def event_stream_bodies(draw: st.DrawFn) -> bytes:
    """An SSE body: events of data/comment/other-field lines, any line ends, maybe a cut end."""
    parts: list[bytes] = []
    if draw(st.integers(0, 20)) == 0:
        parts.append(b"\xef\xbb\xbf")
    for _ in range(draw(st.integers(0, 8))):
        for _ in range(draw(st.integers(1, 3))):
            kind = draw(st.sampled_from(["data", "data", "data", "comment", "field", "bare"]))
            if kind == "data":
                line = b"data:" + draw(st.sampled_from([b" ", b""])) + draw(chat_payloads())
            elif kind == "comment":
                line = b": keep-alive"
            elif kind == "field":
                line = draw(st.sampled_from([b"event: message", b"id: 7", b"retry: 100", b"x-odd: 1"]))
            else:
                line = b"data"
            line = re.sub(rb"[\r\n]", b" ", line)  # a payload's own line breaks would be new lines
            parts.append(line + draw(st.sampled_from(LINE_ENDS)))
        parts.append(draw(st.sampled_from(LINE_ENDS)))  # the blank line that ends the event
    if draw(st.booleans()):
        parts.append(b"data: " + draw(chat_payloads()).replace(b"\n", b" ").replace(b"\r", b" "))
    return b"".join(parts)


@st.composite
def responses(draw: st.DrawFn) -> tuple[bytes, bytes, str]:
    """A well-formed HTTP/1.x response: (raw bytes, its body, its framing: chunked|length|close)."""
    body = draw(event_stream_bodies())
    framing = draw(st.sampled_from(["chunked", "length", "close"]))
    end = draw(st.sampled_from([b"\r\n", b"\n"]))
    interim = b"HTTP/1.1 100 Continue" + end + end if draw(st.booleans()) else b""
    headers = [b"Cache-Control: no-cache"]
    if draw(st.booleans()):
        headers.append(b"Content-Type: text/event-stream; charset=utf-8")
    if framing == "chunked":
        headers.append(b"Transfer-Encoding: chunked")
        encoded = bytearray()
        rest = body
        while rest:
            size = draw(st.integers(1, max(len(rest), 1)))
            piece, rest = rest[:size], rest[size:]
            size_text = (b"%x" if draw(st.booleans()) else b"%X") % len(piece)
            if draw(st.integers(0, 10)) == 0:
                size_text += b";ext=1"
            encoded += size_text + end + piece + end
        encoded += b"0" + end
        if draw(st.booleans()):
            encoded += b"X-Trailer: 1" + end
        encoded += end
        payload = bytes(encoded)
    elif framing == "length":
        headers.append(b"Content-Length: %d" % len(body))
        payload = body
    else:
        headers.append(b"Connection: close")
        payload = body
    head = interim + b"HTTP/1.1 200 OK" + end + b"".join(h + end for h in headers) + end
    return head + payload, body, framing


@st.composite
def splits(draw: st.DrawFn, data: bytes) -> list[bytes]:
    """`data` cut into reads of random sizes (as `recv` would return them)."""
    pieces = []
    rest = data
    while rest:
        size = draw(st.integers(1, max(len(rest), 1)))
        pieces.append(rest[:size])
        rest = rest[size:]
    return pieces


@st.composite
def mutated(draw: st.DrawFn, data: bytes) -> bytes:
    """`data` with a few bytes flipped, inserted or deleted."""
    raw = bytearray(data)
    for _ in range(draw(st.integers(1, 4))):
        if not raw:
            break
        at = draw(st.integers(0, len(raw) - 1))
        action = draw(st.sampled_from(["flip", "insert", "delete", "cut"]))
        if action == "flip":
            raw[at] = draw(st.integers(0, 255))
        elif action == "insert":
            raw[at:at] = draw(st.sampled_from([b"\r", b"\n", b"\r\n", b":", b"0", b"ff", b"\x00", b"data: "]))
        elif action == "delete":
            del raw[at]
        else:
            del raw[at:]
    return bytes(raw)


# ------------------------------------------------------------------------------- references


def reference_payloads(body: bytes) -> list[bytes]:
    """The `data` payloads of a whole SSE body by a plain reading of the standard (test oracle)."""
    if body.startswith(b"\xef\xbb\xbf"):
        body = body[3:]
    lines = re.split(rb"\r\n|\r|\n", body)
    lines.pop()  # what follows the last line end is an unfinished line: dropped at the end
    payloads: list[bytes] = []
    data: list[bytes] | None = None
    for line in lines:
        if not line:
            if data is not None:
                payloads.append(b"\n".join(data))
            data = None
            continue
        if line.startswith(b":"):
            continue
        name, _, value = line.partition(b":")
        if name == b"data":
            data = [*(data or []), value[1:] if value.startswith(b" ") else value]
    return payloads


def held_bytes(parser: EventStreamParser) -> int:
    """What the parser holds between reads (its buffers), for the memory bound."""
    framer = parser._framer
    events = parser._events
    return len(framer._buf) + len(events._partial) + events._event_bytes + len(parser.kept_body)


HELD_BOUND = MAX_HEAD_BYTES + MAX_TRAILER_BYTES + 2 * MAX_EVENT_BYTES + MAX_KEPT_BODY_BYTES


def feed_all(pieces: list[bytes]) -> tuple[EventStreamParser, list[bytes], ProtocolError | None]:
    """Feed every piece, then the end of the connection; stop at the first ProtocolError."""
    parser = EventStreamParser()
    payloads: list[bytes] = []
    try:
        for piece in pieces:
            payloads += parser.feed(piece)
            assert held_bytes(parser) <= HELD_BOUND + len(piece), held_bytes(parser)
        payloads += parser.feed_eof()
    except ProtocolError as error:
        return parser, payloads, error
    return parser, payloads, None


# ---------------------------------------------------------------------------------- targets


def framing_and_sse_agree_with_the_reference(data: st.DataObject) -> None:
    """A well-formed response gives the reference payloads, in every split, and completes."""
    raw, body, framing = data.draw(responses())
    parser, payloads, error = feed_all(data.draw(splits(raw)))
    assert error is None, error
    assert parser.complete, framing
    assert parser.head is not None and parser.head.status == 200 and parser.streaming
    assert payloads == reference_payloads(body)


def any_bytes_only_protocol_errors(data: st.DataObject) -> None:
    """Arbitrary or mutated bytes, any split: nothing but ProtocolError, bounded buffers."""
    if data.draw(st.booleans()):
        raw = data.draw(st.binary(max_size=2000))
        if data.draw(st.booleans()):
            raw = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + raw
    else:
        raw = data.draw(mutated(data.draw(responses())[0]))
    feed_all(data.draw(splits(raw)))


def payloads_never_raise(data: st.DataObject) -> None:
    """classify_payload on chat payloads, JSON values and raw bytes: a ChunkInfo, never a raise."""
    payload = data.draw(st.one_of(chat_payloads(), st.binary(max_size=300)))
    info = classify_payload(payload)
    assert isinstance(info, ChunkInfo) and info.kind in CHUNK_KINDS
    assert info.text_chars >= 0


def stream_verdicts_are_classes(data: st.DataObject) -> None:
    """classify_stream on any events and any transport outcome: ok or a record error class."""
    events = data.draw(st.lists(st.tuples(st.floats(0, 100), chat_payloads()), max_size=12))
    transport = data.draw(st.sampled_from([None, "stream_cut", "http_5xx", "timeout", "protocol_error"]))
    result = StreamResult(events=list(events))
    if transport is not None:
        result.fail(transport, "transport")
    classify_stream(result)
    assert result.error_class is None or result.error_class in ERROR_CLASSES
    assert result.ok or result.error


class OneAnswerServer:
    """A loopback server that answers each connection with scripted bytes, then closes it."""

    def __init__(self) -> None:
        self.answer = b""
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                try:
                    conn.settimeout(2)
                    seen = b""
                    while b"\r\n\r\n" not in seen:
                        got = conn.recv(65536)
                        if not got:
                            break
                        seen += got
                    conn.sendall(self.answer)
                except OSError:
                    pass

    def close(self) -> None:
        self.listener.close()


CLIENT_DEADLINE_S = 2.0


def client_returns_a_class(server: OneAnswerServer, data: st.DataObject) -> None:
    """The whole client against a server sending those bytes: a result, within its deadline."""
    if data.draw(st.booleans()):
        server.answer = data.draw(responses())[0]
    else:
        server.answer = data.draw(mutated(data.draw(responses())[0]))
    endpoint = Endpoint.from_url(f"http://127.0.0.1:{server.port}")
    pool = ConnectionPool(endpoint, reuse="never", first_byte_timeout_s=1.0)
    started = time.monotonic()
    try:
        result = stream_request(pool, endpoint.request_bytes(b'{"stream": true}'), CLIENT_DEADLINE_S)
    finally:
        pool.close()  # the pool's StampSwitch holds a loopback connection open until then
    # the deadline holds by the client's own timeouts; the slack is for a busy machine's scheduling
    assert time.monotonic() - started < CLIENT_DEADLINE_S + 5.0
    assert result.error_class is None or result.error_class in ERROR_CLASSES, result.error_class
    assert result.ok or result.error


# ---------------------------------------------------------------------------- /metrics, /slots

metric_names = st.one_of(
    st.sampled_from(["llamacpp:prompt_tokens_total", "llamacpp:n_tokens_max", "llamacpp:requests_processing",
                     "llamacpp:x", "other_metric", "llamacpp:" + "a" * 50]),
    st.from_regex(r"[a-zA-Z_:][a-zA-Z0-9_:]{0,20}", fullmatch=True),
)  # fmt: skip
label_values = st.text(st.characters(codec="utf-8", exclude_characters="\n"), max_size=12).map(
    lambda text: text.replace("\\", "\\\\").replace('"', '\\"')
)


@st.composite
def exposition_texts(draw: st.DrawFn) -> str:
    """Prometheus text exposition as llama-server writes it, and near misses of it."""
    lines: list[str] = []
    for _ in range(draw(st.integers(0, 10))):
        name = draw(metric_names)
        kind = draw(st.sampled_from(["counter", "gauge", "histogram", "summary", "untyped", "bogus"]))
        if draw(st.booleans()):
            lines.append(f"# HELP {name} {draw(st.text(max_size=20)).replace(chr(10), ' ')}")
        if draw(st.booleans()):
            lines.append(f"# TYPE {name} {kind}")
        labels = draw(st.dictionaries(st.from_regex(r"[a-zA-Z_][a-zA-Z0-9_]{0,6}", fullmatch=True), label_values, max_size=3))
        label_text = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
        value = draw(st.sampled_from(["0", "1.5", "-3", "NaN", "+Inf", "-Inf", "1e309", "1.23457e+06", "x", ""]))
        stamp = draw(st.sampled_from(["", " 1700000000000", " -1", " abc"]))
        lines.append(f"{name}{label_text} {value}{stamp}")
    if draw(st.booleans()):
        lines.append(draw(st.text(max_size=40)))
    return "\n".join(lines) + draw(st.sampled_from(["\n", "", "\n# EOF\n"]))


def metrics_reader_only_server_data_errors(data: st.DataObject) -> None:
    """parse_server_metrics on exposition-like and arbitrary text: samples or ServerDataError."""
    text = data.draw(st.one_of(exposition_texts(), st.text(max_size=300)))
    try:
        samples = parse_server_metrics(text)
    except ServerDataError:
        return
    assert samples and all(sample.name.startswith("llamacpp_") for sample in samples)


def slots_reader_only_server_data_errors(data: st.DataObject) -> None:
    """parse_slots on any JSON value, slot-like or not: slot states or ServerDataError."""
    slot = st.fixed_dictionaries(
        {"id": st.integers(-5, 10**12), "n_ctx": st.integers(-5, 10**12), "is_processing": st.booleans()},
        optional={"n_prompt_tokens": st.one_of(st.integers(-10, 10**12), st.text(max_size=3), st.none())},
    )
    payload = data.draw(st.one_of(st.lists(slot, max_size=8), json_values))
    try:
        slots = parse_slots(payload)
    except ServerDataError:
        return
    assert all(state.tokens >= 0 for state in slots)


# ------------------------------------------------------------------ JSON lists read in pieces


@st.composite
def json_list_texts(draw: st.DrawFn) -> tuple[str, list[Any], list[int]]:
    """A JSON list written with any whitespace between its elements: (text, elements, the line
    each element starts on)."""
    elements = draw(st.lists(json_values, max_size=12))
    gaps = st.sampled_from(["", " ", "\n", "\n\n", "\r\n", "\t", "  \n  "])
    text = "[" + draw(gaps)
    lines: list[int] = []
    for index, element in enumerate(elements):
        if index:
            text += draw(gaps) + "," + draw(gaps)
        lines.append(text.count("\n") + 1)
        indent = draw(st.sampled_from([None, 1, 2]))
        text += json.dumps(element, indent=indent, ensure_ascii=draw(st.booleans()))
    text += draw(gaps) + "]" + draw(st.sampled_from(["", "\n", " \n"]))
    return text, elements, lines


@st.composite
def mutated_text(draw: st.DrawFn, text: str) -> str:
    """`text` with a few characters changed, dropped or doubled, or cut short."""
    chars = list(text)
    for _ in range(draw(st.integers(1, 3))):
        if not chars:
            break
        at = draw(st.integers(0, len(chars) - 1))
        action = draw(st.sampled_from(["swap", "drop", "double", "cut"]))
        if action == "swap":
            chars[at] = draw(st.sampled_from(list(',[]{}":0 \n-.etn')))
        elif action == "drop":
            del chars[at]
        elif action == "double":
            chars.insert(at, chars[at])
        else:
            del chars[at:]
    return "".join(chars)


def json_list_reader_agrees_with_json_loads(data: st.DataObject) -> None:
    """`json_input.iter_array`, reading in pieces of any size, gives json.loads' elements and the
    line each starts on; any other text it reads exactly as json.loads does (the same list, or a
    JsonInputError where json.loads finds no list), never another error."""
    import io

    from quantload import json_input

    size = data.draw(st.integers(1, 64))
    original = json_input.READ_CHARS
    json_input.READ_CHARS = size
    try:
        if data.draw(st.booleans()):
            text, elements, lines = data.draw(json_list_texts())
            got = list(json_input.iter_array(io.StringIO(text)))
            assert [value for _, value in got] == elements
            assert [line for line, _ in got] == lines
            return
        text = data.draw(st.one_of(st.text(max_size=200), json_list_texts().map(lambda t: t[0]).flatmap(mutated_text)))
        try:
            expected = json.loads(text)
        except (ValueError, RecursionError):
            expected = None
        try:
            got = [value for _, value in json_input.iter_array(io.StringIO(text))]
        except json_input.JsonInputError as error:
            assert error.line >= 1
            assert not isinstance(expected, list), f"json.loads reads {text!r} as a list"
            return
        assert got == expected, f"{text!r}: {got!r} != {expected!r}"
    finally:
        json_input.READ_CHARS = original
