"""Server-Sent Events over an HTTP/1.1 response: the `data` payloads of a streamed answer.

`SseSplitter` turns body bytes into the payloads of complete events (and counts comment lines
such as llama-server's `: keep-alive`); `EventStreamParser` puts it behind the HTTP framing
(`quantload.load.http1`) and keeps the body of a non-200 answer, bounded, instead of splitting
it. What each payload says is `quantload.load.openai_chunks`'s job. Pure: nothing here blocks or
reads a clock.
"""

from __future__ import annotations

from quantload.load.http1 import ProtocolError, ResponseFramer, ResponseHead

MAX_ERROR_BODY_BYTES = 64 * 1024
MAX_EVENT_BYTES = 4 * 1024 * 1024


class SseSplitter:
    """Splits an event stream into `data` payloads; counts comment lines (`: keep-alive`)."""

    def __init__(self) -> None:
        self._partial = b""
        self._data: list[bytes] = []
        self.comments = 0

    @property
    def pending(self) -> bool:
        """True when an event has started but not ended."""
        return bool(self._partial or self._data)

    def feed(self, data: bytes) -> list[bytes]:
        """The payloads of every event that `data` completes."""
        if (
            not self._partial
            and not self._data
            and data.startswith(b"data:")
            and data.find(b"\n") == len(data) - 2
            and data.endswith(b"\n\n")
        ):  # the usual case: a piece holding exactly one one-line event
            return [data[6:-2] if data[5] == 0x20 else data[5:-2]]
        text = self._partial + data
        lines = text.split(b"\n")
        self._partial = lines.pop()
        if len(self._partial) > MAX_EVENT_BYTES:
            raise ProtocolError("event line too long")
        events: list[bytes] = []
        for line in lines:
            self._line(line[:-1] if line.endswith(b"\r") else line, events)
        return events

    def finish(self) -> list[bytes]:
        """The stream ended: the payload of an event left without its blank line, if any."""
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


class EventStreamParser:
    """Feed raw response bytes; get back SSE `data` payloads as each event completes.

    After the head arrives `head` is set. For a non-200 response the body is kept (bounded) in
    `error_body` instead of being split into events. `complete` turns true when the message ends
    by its framing; for a body delimited by connection close the caller calls `feed_eof()`.
    """

    def __init__(self) -> None:
        self.error_body = bytearray()
        self._framer = ResponseFramer()
        self._events = SseSplitter()

    @property
    def head(self) -> ResponseHead | None:
        return self._framer.head

    @property
    def complete(self) -> bool:
        return self._framer.complete

    @property
    def comments(self) -> int:
        return self._events.comments

    @property
    def event_pending(self) -> bool:
        """True when an event has started but not ended (useful to classify a cut stream)."""
        return self._events.pending

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Consume bytes; return the payloads of every event completed by them."""
        framer = self._framer
        if framer.complete:
            return []
        pieces = framer.feed(data)
        payloads: list[bytes] = []
        head = framer.head
        if pieces and head is not None:
            if head.status == 200:
                feed = self._events.feed
                for piece in pieces:
                    payloads += feed(piece)
            else:
                for piece in pieces:
                    room = MAX_ERROR_BODY_BYTES - len(self.error_body)
                    if room > 0:
                        self.error_body += piece[:room]
        if framer.complete:
            payloads += self._events.finish()
        return payloads

    def feed_eof(self) -> list[bytes]:
        """The peer closed the connection: a close-delimited body is now complete."""
        if self._framer.feed_eof():
            return self._events.finish()
        return []
