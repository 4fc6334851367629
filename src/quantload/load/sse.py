"""Server-Sent Events over an HTTP/1.1 response: the `data` payloads of a streamed answer.

`SseSplitter` turns body bytes into the payloads of complete events (and counts comment lines
such as llama-server's `: keep-alive`) by the rules of the SSE standard (WHATWG HTML, "event
stream interpretation"): lines end in CRLF, LF or CR alone; a leading byte-order mark is dropped;
an event is dispatched at a blank line when it had a `data` line (its payload may be empty: the
chunk layer counts an empty payload as a chunk without text); an event left without its blank
line when the stream ends is dropped. An event (all its `data` lines together)
is capped at MAX_EVENT_BYTES. `EventStreamParser` puts it behind the HTTP framing
(`quantload.load.http1`) and keeps the body of an answer that is not an event stream (an error
status, a JSON reply, another Content-Type or a compressed body), bounded, instead of splitting
it. What each payload says is `quantload.load.openai_chunks`'s job. Pure: nothing here blocks or
reads a clock; every fault of the bytes is a `ProtocolError`.
"""

from __future__ import annotations

__all__ = ["EventStreamParser"]

from quantload.load.http1 import ProtocolError, ResponseFramer, ResponseHead

MAX_KEPT_BODY_BYTES = 64 * 1024
MAX_EVENT_BYTES = 4 * 1024 * 1024
EVENT_STREAM = "text/event-stream"
_BOM = b"\xef\xbb\xbf"


class SseSplitter:
    """Splits an event stream into `data` payloads; counts comment lines (`: keep-alive`)."""

    def __init__(self) -> None:
        self._partial = b""
        self._data: list[bytes] = []
        self._event_bytes = 0
        self._started = False
        self.comments = 0
        self.dropped_unfinished = False

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
            and 0x0D not in data  # (an int: 7x faster than the bytes b"\r" here)
            and len(data) <= MAX_EVENT_BYTES
        ):  # the usual case: a piece holding exactly one one-line event
            self._started = True
            return [data[6:-2] if data[5] == 0x20 else data[5:-2]]
        text = self._partial + data
        if not self._started and text:
            if _BOM.startswith(text[:3]) and len(text) < 3:
                self._partial = text  # too short to tell whether a BOM starts the stream
                return []
            self._started = True
            text = text.removeprefix(_BOM)
        hold_cr = False
        if b"\r" in text:
            # a CR at the very end may be the first half of a CRLF: decide when the next byte comes
            hold_cr = text.endswith(b"\r")
            if hold_cr:
                text = text[:-1]
            text = text.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
        lines = text.split(b"\n")
        partial = lines.pop()
        events: list[bytes] = []
        for line in lines:
            self._line(line, events)
        if len(partial) > MAX_EVENT_BYTES:
            raise ProtocolError(f"event line longer than {MAX_EVENT_BYTES} bytes")
        self._partial = partial + b"\r" if hold_cr else partial
        return events

    def finish(self) -> list[bytes]:
        """The stream ended: the payload of an event its last CR completed, if any; an event
        without its blank line is dropped, as the standard says."""
        events: list[bytes] = []
        partial, self._partial = self._partial, b""
        if partial.endswith(b"\r"):  # a CR ends its line whatever follows
            self._line(partial[:-1], events)
        elif partial:
            self.dropped_unfinished = True
        if self._data:
            self.dropped_unfinished = True
        self._data = []
        self._event_bytes = 0
        return events

    def _line(self, line: bytes, events: list[bytes]) -> None:
        if len(line) > MAX_EVENT_BYTES:
            raise ProtocolError(f"event line longer than {MAX_EVENT_BYTES} bytes")
        if not line:
            if self._data:
                events.append(b"\n".join(self._data))
                self._data = []
                self._event_bytes = 0
            return
        if line[0] == 0x3A:  # ':' comment, e.g. llama-server's keep-alive ping
            self.comments += 1
            return
        name, _sep, value = line.partition(b":")
        if name == b"data":
            value = value[1:] if value.startswith(b" ") else value
            self._event_bytes += len(value) + 1
            if self._event_bytes > MAX_EVENT_BYTES:
                raise ProtocolError(f"event larger than {MAX_EVENT_BYTES} bytes")
            self._data.append(value)
        # `event:`, `id:`, `retry:` and unknown fields carry nothing we measure


def is_event_stream(head: ResponseHead) -> bool:
    """A 200 whose body is an uncompressed event stream (a missing Content-Type is taken as one)."""
    media = head.media_type
    return (
        head.status == 200
        and head.has_body
        and (media is None or media == EVENT_STREAM)
        and head.content_encoding == "identity"
    )


class EventStreamParser:
    """Feed raw response bytes; get back SSE `data` payloads as each event completes.

    After the head arrives `head` is set. When the answer is not an event stream (`streaming` is
    False: an error status, a 200 JSON reply, another Content-Type, a compressed body) its body is
    kept, bounded, in `kept_body` instead of being split into events. `complete` turns true when
    the message ends by its framing; for a body delimited by connection close the caller calls
    `feed_eof()`.
    """

    def __init__(self) -> None:
        self.kept_body = bytearray()
        self.streaming: bool | None = None
        self._framer = ResponseFramer()
        self._events = SseSplitter()

    @property
    def head(self) -> ResponseHead | None:
        return self._framer.head

    @property
    def complete(self) -> bool:
        return self._framer.complete

    @property
    def leftover(self) -> bool:
        """Bytes came after the end of the message."""
        return self._framer.leftover

    @property
    def comments(self) -> int:
        return self._events.comments

    @property
    def event_pending(self) -> bool:
        """True when an event has started but not ended (useful to classify a cut stream)."""
        return self._events.pending

    @property
    def dropped_unfinished(self) -> bool:
        """The stream ended inside an event, which was dropped."""
        return self._events.dropped_unfinished

    def feed(self, data: bytes | bytearray | memoryview) -> list[bytes]:
        """Consume bytes; return the payloads of every event completed by them."""
        framer = self._framer
        if framer.complete:
            framer.feed(data)  # only notes the leftover
            return []
        pieces = framer.feed(data)
        payloads: list[bytes] = []
        head = framer.head
        if head is not None and self.streaming is None:
            self.streaming = is_event_stream(head)
        if pieces:
            if self.streaming:
                feed = self._events.feed
                for piece in pieces:
                    payloads += feed(piece)
            else:
                for piece in pieces:
                    room = MAX_KEPT_BODY_BYTES - len(self.kept_body)
                    if room > 0:
                        self.kept_body += piece[:room]
        if framer.complete:
            payloads += self._events.finish()
        return payloads

    def feed_eof(self) -> list[bytes]:
        """The peer closed the connection: a close-delimited body is now complete."""
        if self._framer.feed_eof():
            return self._events.finish()
        return []
