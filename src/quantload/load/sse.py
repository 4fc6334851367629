"""Incremental parsing of an HTTP/1.1 streaming response: status and headers, chunked or
length-delimited body, Server-Sent Events, and what each `data:` payload means.

Pure and byte-oriented: the client feeds whatever `recv` returned and gets back the complete SSE
payloads found so far, so it can stamp them all with the arrival time of that read. Nothing here
blocks or reads a clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

MAX_HEAD_BYTES = 64 * 1024
MAX_ERROR_BODY_BYTES = 64 * 1024
MAX_EVENT_BYTES = 4 * 1024 * 1024


class ProtocolError(Exception):
    """The bytes are not a well-formed HTTP/1.1 response."""


@dataclass(frozen=True)
class ResponseHead:
    """Status line and headers (names lower-cased; repeated headers keep the last value)."""

    status: int
    reason: str
    version: str
    headers: dict[str, str]

    @property
    def chunked(self) -> bool:
        return "chunked" in self.headers.get("transfer-encoding", "").lower()

    @property
    def content_length(self) -> int | None:
        raw = self.headers.get("content-length")
        if raw is None:
            return None
        try:
            value = int(raw.strip())
        except ValueError:
            raise ProtocolError(f"bad Content-Length {raw!r}") from None
        if value < 0:
            raise ProtocolError(f"bad Content-Length {raw!r}")
        return value

    @property
    def keep_alive(self) -> bool:
        """Whether the server lets us reuse the connection after this response."""
        connection = self.headers.get("connection", "").lower()
        if "close" in connection:
            return False
        if self.version == "HTTP/1.0":
            return "keep-alive" in connection
        return True


def parse_head(raw: bytes) -> ResponseHead:
    """Parse the status line and headers (without the final blank line)."""
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/"):
        raise ProtocolError(f"bad status line {lines[0][:80]!r}")
    try:
        status = int(parts[1])
    except ValueError:
        raise ProtocolError(f"bad status line {lines[0][:80]!r}") from None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            continue
        name, sep, value = line.partition(":")
        if not sep:
            raise ProtocolError(f"bad header line {line[:80]!r}")
        headers[name.strip().lower()] = value.strip()
    return ResponseHead(status, parts[2] if len(parts) > 2 else "", parts[0], headers)


class ResponseParser:
    """Feed raw bytes; get back SSE `data` payloads (bytes) as each event completes.

    After the head arrives `head` is set. For a non-200 response the body is kept (bounded) in
    `error_body` instead of being split into events. `complete` turns true when the message ends
    by its framing (final chunk, Content-Length reached); for a body delimited by connection close
    the caller calls `feed_eof()`.
    """

    def __init__(self) -> None:
        self.head: ResponseHead | None = None
        self.complete = False
        self.error_body = bytearray()
        self.comments = 0
        self._buf = bytearray()
        self._mode: Literal["head", "chunk_size", "chunk_data", "chunk_crlf", "trailer", "length", "eof"] = (
            "head"
        )
        self._remaining = 0
        self._sse = _SseSplitter()

    @property
    def sse_bytes_pending(self) -> bool:
        """True when an event has started but not ended (useful to classify a cut stream)."""
        return self._sse.pending

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Consume bytes; return the payloads of every event completed by them."""
        if self.complete:
            return []
        events: list[bytes] = []
        if self._mode == "chunk_size":
            raw = bytes(self._buf) + bytes(data) if self._buf else bytes(data)
            used = self._whole_chunks(raw, events)
            self._buf = bytearray(raw[used:]) if used < len(raw) else bytearray()
        else:
            self._buf += data
        while self._step(events):
            pass
        self.comments = self._sse.comments
        return events

    def _whole_chunks(self, raw: bytes, events: list[bytes]) -> int:
        """Fast path: consume every complete chunk of `raw`; return how many bytes it used.

        A streaming server usually sends one SSE event per chunk and the client usually reads
        whole chunks, so this handles nearly all the traffic, and a chunk holding exactly one
        `data: ...` line is cut out of `raw` in one slice. Partial chunks, the last chunk and
        trailers are left to the general state machine.
        """
        length = len(raw)
        pos = 0
        head = self.head
        plain = head is not None and head.status == 200
        sse = self._sse
        while True:
            end = raw.find(b"\r\n", pos)
            if end < 0:
                break
            try:
                size = int(raw[pos:end].split(b";", 1)[0], 16)
            except ValueError:
                break  # the state machine raises the ProtocolError
            start = end + 2
            stop = start + size
            if size == 0 or stop + 2 > length:
                break
            if raw[stop : stop + 2] != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
            if (
                plain
                and sse.idle
                and raw.startswith(b"data:", start)
                and raw.find(b"\n", start, stop) == stop - 2
                and raw[stop - 1] == 0x0A
            ):  # exactly one one-line event
                first = start + 6 if raw[start + 5] == 0x20 else start + 5
                events.append(raw[first : stop - 2])
            elif plain:
                events.extend(sse.feed(raw[start:stop]))
            else:
                self._body(raw[start:stop], events)
            pos = stop + 2
        return pos

    def feed_eof(self) -> list[bytes]:
        """The peer closed the connection: a close-delimited body is now complete."""
        if self._mode == "eof" and not self.complete:
            self.complete = True
            events = self._sse.finish()
            self.comments = self._sse.comments
            return events
        return []

    def _body(self, data: bytes | bytearray, events: list[bytes]) -> None:
        if not data:
            return
        head = self.head
        if head is not None and head.status != 200:
            room = MAX_ERROR_BODY_BYTES - len(self.error_body)
            if room > 0:
                self.error_body += data[:room]
            return
        events.extend(self._sse.feed(data))

    def _finish_body(self, events: list[bytes]) -> None:
        self.complete = True
        events.extend(self._sse.finish())

    def _take_counted_body(self, events: list[bytes]) -> bool:
        """Pass up to `_remaining` buffered body bytes on; False when nothing is buffered."""
        buf = self._buf
        if not buf:
            return False
        take = min(self._remaining, len(buf))
        piece = bytes(buf[:take])
        del buf[:take]
        self._remaining -= take
        self._body(piece, events)
        return True

    def _step(self, events: list[bytes]) -> bool:
        buf = self._buf
        mode = self._mode
        if mode == "head":
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise ProtocolError("response head too large")
                return False
            head = parse_head(bytes(buf[:end]))
            del buf[: end + 4]
            if 100 <= head.status < 200:
                return True  # an interim response (100 Continue): the real head follows
            self.head = head
            length = head.content_length
            if head.chunked:
                self._mode = "chunk_size"
            elif length is not None:
                self._mode = "length"
                self._remaining = length
                if length == 0:
                    self._finish_body(events)
                    return False
            else:
                self._mode = "eof"
            return True
        if mode == "chunk_size":
            end = buf.find(b"\r\n")
            if end < 0:
                if len(buf) > 1024:
                    raise ProtocolError("chunk size line too long")
                return False
            size_text = bytes(buf[:end]).split(b";", 1)[0].strip()
            try:
                size = int(size_text, 16)
            except ValueError:
                raise ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
            del buf[: end + 2]
            if size == 0:
                self._mode = "trailer"
            else:
                self._mode = "chunk_data"
                self._remaining = size
            return True
        if mode == "chunk_data":
            if not self._take_counted_body(events):
                return False
            if self._remaining == 0:
                self._mode = "chunk_crlf"
            return True
        if mode == "chunk_crlf":
            if len(buf) < 2:
                return False
            if buf[:2] != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
            del buf[:2]
            self._mode = "chunk_size"
            return True
        if mode == "trailer":
            end = buf.find(b"\r\n")
            if end < 0:
                return False
            del buf[: end + 2]
            if end == 0:  # the blank line closing the (usually empty) trailer
                self._finish_body(events)
                return False
            return True
        if mode == "length":
            if not self._take_counted_body(events):
                return False
            if self._remaining == 0:
                self._finish_body(events)
                return False
            return True
        # mode == "eof": everything is body until the peer closes
        if not buf:
            return False
        piece = bytes(buf)
        buf.clear()
        self._body(piece, events)
        return False


class _SseSplitter:
    """Splits an event stream into `data` payloads; counts comment lines (`: keep-alive`)."""

    def __init__(self) -> None:
        self._partial = b""
        self._data: list[bytes] = []
        self.comments = 0

    @property
    def pending(self) -> bool:
        return bool(self._partial or self._data)

    @property
    def idle(self) -> bool:
        """No partial line or event waiting for more bytes."""
        return not self._partial and not self._data

    def feed(self, data: bytes | bytearray) -> list[bytes]:
        if (
            not self._partial
            and not self._data
            and data.startswith(b"data:")
            and data.find(b"\n") == len(data) - 2
            and data.endswith(b"\n\n")
        ):  # the usual case: exactly one one-line event
            value = bytes(data[5:-2])
            return [value[1:] if value.startswith(b" ") else value]
        text = self._partial + bytes(data)
        lines = text.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_EVENT_BYTES:
            raise ProtocolError("event line too long")
        events: list[bytes] = []
        for line in lines:
            self._line(line[:-1] if line.endswith(b"\r") else line, events)
        return events

    def finish(self) -> list[bytes]:
        events: list[bytes] = []
        if self._partial:
            partial, self._partial = self._partial, b""
            self._line(partial.rstrip(b"\r"), events)
        self._line(b"", events)
        return events

    def _line(self, line: bytes, events: list[bytes]) -> None:
        if not line:
            if self._data:
                events.append(b"\n".join(self._data))
                self._data = []
            return
        if line[0] == 0x3A:  # ':' comment, e.g. llama-server's keep-alive ping
            self.comments += 1
            return
        name, _sep, value = line.partition(b":")
        if name == b"data":
            self._data.append(value[1:] if value.startswith(b" ") else value)
        # `event:`, `id:`, `retry:` and unknown fields carry nothing we measure


_loads = json.loads
ChunkKind = Literal["content", "empty", "done", "error", "malformed"]


@dataclass
class ChunkInfo:
    """What one `data:` payload of an OpenAI-style stream says."""

    kind: ChunkKind
    text_chars: int = 0
    finish_reason: str | None = None
    usage: dict[str, Any] | None = None
    timings: dict[str, Any] | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _choice_text(choice: Any) -> int:
    """Characters of generated text in one choice: content, reasoning, tool calls, legacy text."""
    if type(choice) is not dict:
        return 0
    chars = 0
    delta = choice.get("delta")
    if type(delta) is dict:
        for key in ("content", "reasoning_content", "reasoning"):
            value = delta.get(key)
            if value and type(value) is str:
                chars += len(value)
        calls = delta.get("tool_calls")
        if calls and type(calls) is list:
            chars += sum(len(json.dumps(call)) for call in calls)
    text = choice.get("text")
    if text and type(text) is str:
        chars += len(text)
    return chars


def classify_payload(payload: bytes) -> ChunkInfo:
    """Decide whether a payload carries generated text, ends the stream, or is an error.

    Role-only deltas (`"content": null`), empty strings and chunks without choices are "empty":
    they never stop the TTFT clock. JSON whitespace does not matter since the payload is parsed.
    """
    stripped = payload.strip()
    if stripped == b"[DONE]":
        return ChunkInfo("done")
    try:
        obj = _loads(stripped)
    except ValueError:
        return ChunkInfo("malformed", error=stripped[:120].decode("utf-8", "replace"))
    if not isinstance(obj, dict):
        return ChunkInfo("malformed", error=stripped[:120].decode("utf-8", "replace"))
    if "error" in obj:
        error = obj["error"]
        message = error.get("message") if isinstance(error, dict) else error
        return ChunkInfo("error", error=str(message)[:300])
    info = ChunkInfo("empty")
    choices = obj.get("choices")
    if choices and type(choices) is list:
        for choice in choices:
            info.text_chars += _choice_text(choice)
            if type(choice) is dict and choice.get("finish_reason"):
                info.finish_reason = str(choice["finish_reason"])
    usage = obj.get("usage")
    if usage and type(usage) is dict:
        info.usage = usage
    timings = obj.get("timings")
    if timings and type(timings) is dict:
        info.timings = timings
    if info.text_chars > 0:
        info.kind = "content"
    return info
