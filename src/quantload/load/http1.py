"""Incremental HTTP/1.1 response framing: status line and headers, then the body as it arrives,
whether chunked, length-delimited or delimited by the connection closing.

Pure and byte-oriented: `ResponseFramer.feed` takes whatever `recv` returned and gives back the
body bytes found so far (one piece per chunk on the usual path), so the caller can stamp them
with the arrival time of that read. It knows nothing about what the body means; the event-stream
layer (`quantload.load.sse`) does.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_SIZE_LINE_BYTES = 1024


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

    @property
    def reusable_framing(self) -> bool:
        """The body's end is marked by its framing, so the connection survives the response."""
        return self.chunked or self.content_length is not None


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


FramingState = Literal["head", "chunk_size", "chunk_data", "chunk_crlf", "trailer", "length", "eof"]


class ResponseFramer:
    """Feed raw bytes; get back the body bytes they complete, in order.

    `head` is set once the head has arrived (interim 1xx responses are skipped). `complete` turns
    true when the message ends by its framing (final chunk, Content-Length reached); for a body
    delimited by connection close the caller calls `feed_eof()`.
    """

    def __init__(self) -> None:
        self.head: ResponseHead | None = None
        self.complete = False
        self._buf = bytearray()
        self._state: FramingState = "head"
        self._remaining = 0

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Consume bytes; return the body pieces they complete."""
        if self.complete:
            return []
        pieces: list[bytes] = []
        if self._state == "chunk_size":
            raw = bytes(self._buf) + bytes(data) if self._buf else bytes(data)
            used = self._whole_chunks(raw, pieces)
            self._buf = bytearray(raw[used:]) if used < len(raw) else bytearray()
        else:
            self._buf += data
        while self._step(pieces):
            pass
        return pieces

    def feed_eof(self) -> bool:
        """The peer closed the connection; True when that completed a close-delimited body."""
        if self._state == "eof" and not self.complete:
            self.complete = True
            return True
        return False

    def _whole_chunks(self, raw: bytes, pieces: list[bytes]) -> int:
        """Fast path: cut every complete chunk out of `raw`; return how many bytes it used.

        A streaming server usually sends one event per chunk and the client usually reads whole
        chunks, so this handles nearly all the traffic with one slice per chunk. Partial chunks,
        the last chunk and trailers are left to the general state machine.
        """
        length = len(raw)
        pos = 0
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
            pieces.append(raw[start:stop])
            pos = stop + 2
        return pos

    def _take_counted(self, pieces: list[bytes]) -> bool:
        """Pass up to `_remaining` buffered body bytes on; False when nothing is buffered."""
        buf = self._buf
        if not buf:
            return False
        take = min(self._remaining, len(buf))
        pieces.append(bytes(buf[:take]))
        del buf[:take]
        self._remaining -= take
        return True

    def _step(self, pieces: list[bytes]) -> bool:
        """One transition of the state machine; False when it needs more bytes (or is done)."""
        state = self._state
        if state == "head":
            return self._step_head()
        if state == "chunk_size":
            return self._step_chunk_size()
        if state == "chunk_data":
            if not self._take_counted(pieces):
                return False
            if self._remaining == 0:
                self._state = "chunk_crlf"
            return True
        if state == "chunk_crlf":
            buf = self._buf
            if len(buf) < 2:
                return False
            if buf[:2] != b"\r\n":
                raise ProtocolError("chunk not followed by CRLF")
            del buf[:2]
            self._state = "chunk_size"
            return True
        if state == "trailer":
            buf = self._buf
            end = buf.find(b"\r\n")
            if end < 0:
                return False
            del buf[: end + 2]
            if end == 0:  # the blank line closing the (usually empty) trailer
                self.complete = True
                return False
            return True
        if state == "length":
            if not self._take_counted(pieces):
                return False
            if self._remaining == 0:
                self.complete = True
                return False
            return True
        # state == "eof": everything is body until the peer closes
        if self._buf:
            pieces.append(bytes(self._buf))
            self._buf.clear()
        return False

    def _step_head(self) -> bool:
        buf = self._buf
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
            self._state = "chunk_size"
        elif length is not None:
            self._state = "length"
            self._remaining = length
            if length == 0:
                self.complete = True
                return False
        else:
            self._state = "eof"
        return True

    def _step_chunk_size(self) -> bool:
        buf = self._buf
        end = buf.find(b"\r\n")
        if end < 0:
            if len(buf) > MAX_CHUNK_SIZE_LINE_BYTES:
                raise ProtocolError("chunk size line too long")
            return False
        size_text = bytes(buf[:end]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise ProtocolError(f"bad chunk size {size_text[:20]!r}") from None
        del buf[: end + 2]
        if size == 0:
            self._state = "trailer"
        else:
            self._state = "chunk_data"
            self._remaining = size
        return True
