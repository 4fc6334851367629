"""Incremental HTTP/1.1 response framing: status line and headers, then the body as it arrives,
whether chunked, length-delimited or delimited by the connection closing.

Pure and byte-oriented: `ResponseFramer.feed` takes whatever `recv` returned and gives back the
body bytes found so far (one piece per chunk on the usual path), so the caller can stamp them
with the arrival time of that read. It knows nothing about what the body means; the event-stream
layer (`quantload.load.sse`) does.

What it accepts, and what it refuses with `ProtocolError` (never any other exception):
- line ends CRLF or a bare LF (RFC 9112 2.2 lets a recipient take LF alone) in the head, the
  chunk-size lines, after chunk data and in the trailer; empty lines before the status line;
- no body for 1xx (skipped: the real head follows), 204 and 304, whatever their headers say;
- Transfer-Encoding `chunked` only, chunk sizes of 1 to 16 hex digits, Content-Length of digits
  only; a Transfer-Encoding beside a Content-Length wins (RFC 9112 6.3);
- bounded memory whatever the peer sends: the head, a chunk-size line, the trailer and the count
  of interim responses are capped; body bytes are passed on, never buffered beyond one read.
"""

from __future__ import annotations

__all__ = ["ProtocolError"]

import re
from dataclasses import dataclass
from functools import cached_property
from typing import Literal

MAX_HEAD_BYTES = 64 * 1024
MAX_CHUNK_SIZE_LINE_BYTES = 1024
MAX_TRAILER_BYTES = 16 * 1024
MAX_INTERIM_RESPONSES = 16
NO_BODY_STATUSES = (204, 304)
_HEX_SIZE = re.compile(rb"[0-9A-Fa-f]{1,16}")
_STATUS_LINE = re.compile(r"(HTTP/\d\.\d) ([0-9]{3})(?: (.*))?")
_TOKEN = re.compile(r"[!#$%&'*+.^_`|~0-9A-Za-z-]+")


class ProtocolError(Exception):
    """The bytes are not a well-formed HTTP/1.1 response."""


@dataclass(frozen=True)
class ResponseHead:
    """Status line and headers (names lower-cased; repeated headers keep the last value)."""

    status: int
    reason: str
    version: str
    headers: dict[str, str]

    @cached_property
    def chunked(self) -> bool:
        """Chunked transfer coding; ProtocolError for any other (quantload asks for none)."""
        raw = self.headers.get("transfer-encoding")
        if raw is None:
            return False
        codings = [part.strip().lower() for part in raw.split(",") if part.strip()]
        if codings != ["chunked"]:
            raise ProtocolError(f"unsupported Transfer-Encoding {raw[:40]!r}")
        return True

    @cached_property
    def content_length(self) -> int | None:
        raw = self.headers.get("content-length")
        if raw is None:
            return None
        text = raw.strip()
        if not (text.isascii() and text.isdigit()) or len(text) > 18:
            raise ProtocolError(f"bad Content-Length {raw[:40]!r}")
        return int(text)

    @property
    def has_body(self) -> bool:
        return self.status not in NO_BODY_STATUSES

    @property
    def media_type(self) -> str | None:
        """The Content-Type without parameters, lower-cased; None when the header is missing."""
        raw = self.headers.get("content-type")
        return raw.split(";", 1)[0].strip().lower() if raw is not None else None

    @property
    def content_encoding(self) -> str:
        """The Content-Encoding, lower-cased; "identity" when there is none."""
        return self.headers.get("content-encoding", "").strip().lower() or "identity"

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
        return not self.has_body or self.chunked or self.content_length is not None


def parse_head(raw: bytes) -> ResponseHead:
    """Parse the status line and headers (without the final blank line); CRLF or LF line ends."""
    lines = raw.decode("latin-1").split("\n")
    status_line = lines[0].removesuffix("\r")
    match = _STATUS_LINE.fullmatch(status_line)
    if match is None:
        raise ProtocolError(f"bad status line {status_line[:80]!r}")
    version, status, reason = match.group(1), int(match.group(2)), match.group(3) or ""
    headers: dict[str, str] = {}
    for raw_line in lines[1:]:
        line = raw_line.removesuffix("\r")
        if not line:
            continue
        if line[0] in " \t":
            raise ProtocolError(f"folded header line {line[:80]!r}")
        name, sep, value = line.partition(":")
        plain = name.isascii() and name.replace("-", "").isalnum()  # most names: no regex needed
        if not sep or not (plain or _TOKEN.fullmatch(name)):
            raise ProtocolError(f"bad header line {line[:80]!r}")
        headers[name.lower()] = value.strip(" \t")
    return ResponseHead(status, reason, version, headers)


def _blank_line(buf: bytearray) -> tuple[int, int]:
    """Where the head's closing blank line starts and ends, or (-1, -1) while it has not come."""
    lf = buf.find(b"\n\n")
    crlf = buf.find(b"\n\r\n")
    if crlf >= 0 and (lf < 0 or crlf < lf):
        return crlf, crlf + 3
    if lf >= 0:
        return lf, lf + 2
    return -1, -1


FramingState = Literal["head", "chunk_size", "chunk_data", "chunk_crlf", "trailer", "length", "eof"]


class ResponseFramer:
    """Feed raw bytes; get back the body bytes they complete, in order.

    `head` is set once the head has arrived (interim 1xx responses are skipped). `complete` turns
    true when the message ends by its framing (final chunk, Content-Length reached, a status
    without a body); for a body delimited by connection close the caller calls `feed_eof()`.
    `leftover` turns true when bytes came after the end of the message (the connection is then
    not fit for another request).
    """

    def __init__(self) -> None:
        self.head: ResponseHead | None = None
        self.complete = False
        self.leftover = False
        self._buf = bytearray()
        self._state: FramingState = "head"
        self._remaining = 0
        self._interim = 0
        self._trailer_bytes = 0
        self._after_head = False

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Consume bytes; return the body pieces they complete."""
        if self.complete:
            if data:
                self.leftover = True
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
        if self.complete and self._buf:
            self.leftover = True
            self._buf.clear()
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
        chunks, so this handles nearly all the traffic with one slice per chunk. Anything else
        (partial chunks, extensions, bare LF, the last chunk and trailers, errors) is left to
        the general state machine, which decides exactly as if this path did not exist.
        """
        length = len(raw)
        pos = 0
        while True:
            end = raw.find(b"\r\n", pos)
            if end < 0:
                break
            size_text = raw[pos:end]
            # hex digits only: isalnum() leaves out the whitespace, signs and underscores int()
            # takes, the second byte test its "0x" prefix; other letters make int() refuse
            if not size_text.isalnum() or len(size_text) > 16 or size_text[1:2] in (b"x", b"X"):
                break
            try:
                size = int(size_text, 16)
            except ValueError:
                break  # the state machine raises the ProtocolError
            start = end + 2
            stop = start + size
            if size == 0 or stop + 2 > length or raw[stop : stop + 2] != b"\r\n":
                break
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
            if self._after_head:  # the chunks that came with the head: the fast path, once
                self._after_head = False
                buf = self._buf
                if buf:
                    used = self._whole_chunks(bytes(buf), pieces)
                    del buf[:used]
            return self._step_chunk_size()
        if state == "chunk_data":
            if not self._take_counted(pieces):
                return False
            if self._remaining == 0:
                self._state = "chunk_crlf"
            return True
        if state == "chunk_crlf":
            return self._step_chunk_crlf()
        if state == "trailer":
            return self._step_trailer()
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
        if buf and buf[0] in (0x0D, 0x0A):  # empty lines before a status line are ignored (RFC 9112 2.2)
            del buf[: len(buf) - len(buf.lstrip(b"\r\n"))]
        start, end = _blank_line(buf)
        if start < 0 or start > MAX_HEAD_BYTES:
            if len(buf) > MAX_HEAD_BYTES:
                raise ProtocolError("response head too large")
            return False
        head = parse_head(bytes(buf[:start]))
        del buf[:end]
        if 100 <= head.status < 200:
            self._interim += 1
            if self._interim > MAX_INTERIM_RESPONSES:
                raise ProtocolError("too many interim (1xx) responses")
            return True  # an interim response (100 Continue): the real head follows
        self.head = head
        if not head.has_body:
            self.complete = True
            return False
        if head.chunked:
            self._state = "chunk_size"
            self._after_head = True
            return True
        length = head.content_length
        if length is not None:
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
        end = buf.find(b"\n")
        if end < 0:
            if len(buf) > MAX_CHUNK_SIZE_LINE_BYTES:
                raise ProtocolError("chunk size line too long")
            return False
        if end > MAX_CHUNK_SIZE_LINE_BYTES:
            raise ProtocolError("chunk size line too long")
        line = bytes(buf[:end]).removesuffix(b"\r")
        size_text = line.split(b";", 1)[0].strip(b" \t") if b";" in line else line
        if _HEX_SIZE.fullmatch(size_text) is None:
            raise ProtocolError(f"bad chunk size {size_text[:20]!r}")
        size = int(size_text, 16)
        del buf[: end + 1]
        if size == 0:
            self._state = "trailer"
        else:
            self._state = "chunk_data"
            self._remaining = size
        return True

    def _step_chunk_crlf(self) -> bool:
        buf = self._buf
        if buf[:1] == b"\n":
            del buf[:1]
        elif buf[:2] == b"\r\n":
            del buf[:2]
        elif buf == b"\r" or not buf:
            return False
        else:
            raise ProtocolError("chunk not followed by CRLF")
        self._state = "chunk_size"
        return True

    def _step_trailer(self) -> bool:
        buf = self._buf
        end = buf.find(b"\n")
        if end < 0:
            if self._trailer_bytes + len(buf) > MAX_TRAILER_BYTES:
                raise ProtocolError("trailer too large")
            return False
        self._trailer_bytes += end + 1
        if self._trailer_bytes > MAX_TRAILER_BYTES:
            raise ProtocolError("trailer too large")
        line = buf[:end]
        del buf[: end + 1]
        if not line or line == b"\r":  # the blank line closing the (usually empty) trailer
            self.complete = True
            return False
        return True
