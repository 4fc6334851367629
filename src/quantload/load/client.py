"""A lean streaming HTTP/1.1 client on plain sockets: one POST, its stream read chunk by chunk.

Why hand-written: measured on a 2-core machine, every general-purpose client added CPU per
request (requests: ~70% of user time in request setup) or buffered small SSE events
(geventhttpclient's `iter_lines`), and both showed up as TTFT error at 64+ streams. Here a request
is one `sendall` of pre-built bytes, and each read is stamped with the time its bytes arrived
(the kernel's receive time where available, `quantload.load.arrival`) *before* any parsing, so
neither parsing nor a late read shifts a timestamp.

It uses the stdlib `socket`/`ssl` modules through their module attributes, so inside a Locust
process (gevent monkey-patched) every call cooperates with the other users, and in a plain
process (tests, scripts) it simply blocks its thread.

Connections: llama-server advertises keep-alive but closes the connection after every streamed
response, while other servers keep it open. `ConnectionPool` keeps idle connections that the
server allowed to live, checks a connection is still open before reusing it, and if a reused
connection turns out to be dead before any response byte it retries once on a fresh connection
and stops reusing connections to that server. TTFT never includes connecting: the clock starts
when the request bytes are handed to the socket; the connect time is reported apart. Over TLS the
same holds (the liveness check reads the TLS layer, which cannot be peeked).

Time limits: connecting (`connect_timeout_s`), the first response byte (`first_byte_timeout_s`:
llama-server sends its head with the first token, so this bounds queueing and prefill; a silent
server costs this long, not the whole deadline) and the whole request (`timeout_s`).

The answer must be what was asked for: an uncompressed (`Accept-Encoding: identity`) event
stream. A 200 with a JSON body (the server ignored `"stream": true`), another Content-Type or
another status is `not_streamed`; a compressed one is a `protocol_error`.
"""

from __future__ import annotations

import contextlib
import socket
import ssl
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from quantload.load.arrival import SWITCH_WAIT_S, StampSwitch, enable_kernel_stamps, read_stamped
from quantload.load.http1 import ProtocolError, ResponseHead
from quantload.load.openai_chunks import classify_payload, classify_stream, context_exceeded
from quantload.load.sse import EventStreamParser
from quantload.load.stream_result import StreamResult
from quantload.urls import BadUrl, header_safe, http_address

RECV_BYTES = 64 * 1024
MAX_IDLE_PER_POOL = 1024
ReusePolicy = Literal["auto", "always", "never"]


class EndpointError(ValueError):
    """A URL that this client cannot talk to."""


@dataclass(frozen=True)
class Endpoint:
    """Where requests go: scheme, host, port and the path of the streaming route."""

    scheme: str
    host: str
    port: int
    path: str
    api_key: str | None = None

    @classmethod
    def from_url(
        cls, base_url: str, path: str = "/v1/chat/completions", api_key: str | None = None
    ) -> Endpoint:
        """`http://127.0.0.1:8080` (a trailing `/v1` is tolerated) plus the route path."""
        try:
            address = http_address(base_url)
        except BadUrl as error:
            raise EndpointError(str(error)) from None
        if api_key is not None and not header_safe(api_key):
            raise EndpointError("the API key holds a character an HTTP header cannot carry")
        prefix = address.prefix
        if prefix.endswith("/v1") and path.startswith("/v1/"):
            prefix = prefix[: -len("/v1")]
        return cls(address.scheme, address.host, address.port, prefix + path, api_key)

    @property
    def host_header(self) -> str:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port == default else f"{host}:{self.port}"

    def request_bytes(self, body: bytes, extra_headers: Mapping[str, str] | None = None) -> bytes:
        """The complete HTTP/1.1 POST for `body` (JSON), ready for one `sendall`."""
        lines = [
            f"POST {self.path} HTTP/1.1",
            f"Host: {self.host_header}",
            "User-Agent: quantload",
            "Accept: text/event-stream",
            "Accept-Encoding: identity",
            "Content-Type: application/json",
            f"Content-Length: {len(body)}",
        ]
        if self.api_key:
            lines.append(f"Authorization: Bearer {self.api_key}")
        for name, value in (extra_headers or {}).items():
            lines.append(f"{name}: {value}")
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


class ConnectionPool:
    """Idle connections to one endpoint, shared by every user of a process."""

    def __init__(
        self,
        endpoint: Endpoint,
        connect_timeout_s: float = 10.0,
        reuse: ReusePolicy = "auto",
        first_byte_timeout_s: float | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.connect_timeout_s = connect_timeout_s
        self.first_byte_timeout_s = first_byte_timeout_s
        self.reuse = reuse
        self.server_closes_streams = False  # learned in "auto" mode
        self.kernel_stamps = False  # reads stamped with the kernel's receive time (see arrival)
        self._stamps = StampSwitch()  # keeps that stamping on, and waits until it is
        self._stamps_lock = threading.Lock()
        self._idle: list[socket.socket] = []
        self._lock = threading.Lock()
        self._ssl = ssl_context  # None: the system's trust store (SSL_CERT_FILE, SSL_CERT_DIR)

    @property
    def reuse_enabled(self) -> bool:
        if self.reuse == "never":
            return False
        return self.reuse == "always" or not self.server_closes_streams

    def take(self) -> socket.socket | None:
        """An idle connection that is still open, or None."""
        while True:
            with self._lock:
                if not self._idle:
                    return None
                sock = self._idle.pop()
            if _still_open(sock):
                return sock
            _close(sock)
            if self.reuse == "auto":
                self.server_closes_streams = True

    def give(self, sock: socket.socket) -> None:
        """Return a connection whose response ended cleanly and that the server keeps open."""
        if not self.reuse_enabled:
            _close(sock)
            return
        with self._lock:
            if len(self._idle) < MAX_IDLE_PER_POOL:
                self._idle.append(sock)
                return
        _close(sock)

    def note_stale(self) -> None:
        """A reused connection was dead: stop reusing connections in "auto" mode."""
        if self.reuse == "auto":
            self.server_closes_streams = True

    def connect(self, timeout_s: float) -> socket.socket:
        """A new connection (TCP_NODELAY; TLS when the endpoint is https)."""
        sock = socket.create_connection(
            (self.endpoint.host, self.endpoint.port), timeout=max(timeout_s, 0.001)
        )
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.endpoint.scheme == "http":
            self.kernel_stamps = enable_kernel_stamps(sock)
            if self.kernel_stamps and not self._stamps.on:
                with self._stamps_lock:  # once per pool: later connections find it on
                    self._stamps.wait_on(min(SWITCH_WAIT_S, max(timeout_s, 0.001)))
        else:
            if self._ssl is None:
                self._ssl = ssl.create_default_context()
            sock = self._ssl.wrap_socket(sock, server_hostname=self.endpoint.host)
        return sock

    def close(self) -> None:
        """Close every idle connection."""
        with self._lock:
            idle, self._idle = self._idle, []
        for sock in idle:
            _close(sock)
        self._stamps.close()


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.close()


def _still_open(sock: socket.socket) -> bool:
    """True when the peer has not closed the connection and sent nothing unexpected.

    A plain socket is peeked. A TLS socket cannot be (its `recv` takes no flags), so it is read
    without blocking: nothing to read means open (a TLS record that carries no data, such as a
    session ticket, is consumed on the way); data or the end of the stream mean not reusable.
    """
    tls = isinstance(sock, ssl.SSLSocket)
    try:
        if isinstance(sock, ssl.SSLSocket) and sock.pending():
            return False
        sock.settimeout(0.0)
        try:
            data = sock.recv(1) if tls else sock.recv(1, socket.MSG_PEEK)
        finally:
            sock.settimeout(None)
    except (BlockingIOError, ssl.SSLWantReadError):
        return True
    except (OSError, ValueError):
        return False
    del data  # b"" means closed; stray bytes mean a confused connection: neither is reusable
    return False


def stream_request(
    pool: ConnectionPool,
    request: bytes,
    timeout_s: float,
    socket_deadline: bool = True,
    classify: bool = True,
) -> StreamResult:
    """Send one request and read its whole stream; never raises for network or server faults.

    `timeout_s` bounds the whole request (connect included); the pool's `first_byte_timeout_s`
    the wait for the first response byte. Errors come back as `error_class`: connect_refused,
    connect_error, context_exceeded (llama-server's 400 for a prompt that fills the slot, with
    its two counts), http_4xx, http_5xx, not_streamed, timeout, stream_cut, malformed_chunk,
    server_error_event, protocol_error.

    With `socket_deadline=False` the reads block without a socket timeout and the caller must
    enforce the deadline itself (under gevent: one `gevent.Timeout` around the call, instead of a
    timer armed and disarmed for every read); connecting is still bounded.

    While reading, each SSE event is only stamped with the arrival time of the read that
    completed it; what the events say is worked out afterwards by `classify_stream`, which
    `classify=False` leaves to the caller (the Locust runtime does it off the users' path).
    """
    deadline = time.perf_counter() + timeout_s
    sock = pool.take() if pool.reuse_enabled else None
    reused = sock is not None
    connect_s: float | None = None
    if sock is None:
        sock, connect_s, failure = _connect(pool, deadline)
        if failure is not None:
            return failure
    assert sock is not None
    result = _exchange(pool, sock, request, deadline, socket_deadline)
    if reused and result.bytes_received == 0 and result.error_class in ("connect_error", "stream_cut"):
        pool.note_stale()
        sock, connect_s, failure = _connect(pool, deadline)
        if failure is not None:
            failure.retried_stale = True
            return failure
        assert sock is not None
        result = _exchange(pool, sock, request, deadline, socket_deadline)
        result.retried_stale = True
        reused = False
    result.connect_s = connect_s
    result.connection_reused = reused
    return classify_stream(result) if classify else result


def _connect(
    pool: ConnectionPool, deadline: float
) -> tuple[socket.socket | None, float | None, StreamResult | None]:
    start = time.perf_counter()
    remaining = deadline - start
    timeout = min(pool.connect_timeout_s, remaining)
    try:
        sock = pool.connect(timeout)
    except ConnectionRefusedError as error:
        return None, None, StreamResult(error_class="connect_refused", error=str(error))
    except TimeoutError:
        cls = "timeout" if timeout >= remaining else "connect_error"
        return (
            None,
            None,
            StreamResult(error_class=cls, error=f"connect timed out after {timeout:.3g} s"),
        )
    except (OSError, ssl.SSLError) as error:
        return (
            None,
            None,
            StreamResult(error_class="connect_error", error=str(error) or repr(error)),
        )
    return sock, time.perf_counter() - start, None


def _exchange(
    pool: ConnectionPool, sock: socket.socket, request: bytes, deadline: float, socket_deadline: bool
) -> StreamResult:
    """Send and read to the end of the message, stamping every event; no chunk is parsed here."""
    result = StreamResult()
    parser = EventStreamParser()
    buf = bytearray(RECV_BYTES)
    view = memoryview(buf)
    events = result.events
    kernel_stamps = pool.kernel_stamps
    keep = False
    first_byte_s = pool.first_byte_timeout_s
    # until the first response byte the socket has a timeout even when the caller keeps the
    # deadline (socket_deadline=False); after it, only when the client keeps the deadline itself
    waiting_first: bool | None = False
    try:
        result.sent_unix_s = time.time()
        sent = result.sent_perf_s = time.perf_counter()
        first_deadline = deadline if first_byte_s is None else min(sent + first_byte_s, deadline)
        sock.settimeout(max(first_deadline - sent, 0.001))
        sock.sendall(request)
        while not parser.complete:
            now_s = time.perf_counter()
            remaining = deadline - now_s
            if remaining <= 0:
                return result.fail("timeout", "request deadline passed")
            if result.bytes_received == 0:
                waiting_first = first_deadline < deadline
                sock.settimeout(max(first_deadline - now_s, 0.001))
            elif socket_deadline:
                sock.settimeout(remaining)
            elif waiting_first is not None:
                sock.settimeout(None)
                waiting_first = None
            count, arrived, from_kernel = read_stamped(sock, view, kernel_stamps)
            now = arrived - sent
            if count:
                if from_kernel:
                    result.reads_kernel_stamped += 1
                else:
                    result.reads_read_stamped += 1
            if count == 0:
                payloads = parser.feed_eof()
                if not parser.complete:
                    if parser.head is None:
                        return result.fail("connect_error", "connection closed before a response")
                    return result.fail("stream_cut", "connection closed mid-stream")
            else:
                result.bytes_received += count
                payloads = parser.feed(view[:count])
            for payload in payloads:
                events.append((now, payload))
            if result.status is None and parser.head is not None:
                result.status = parser.head.status
                result.ttfb_s = now
            if parser.complete:
                result.end_s = now
        result.comments = parser.comments
        head = parser.head
        assert head is not None
        keep = head.keep_alive and head.reusable_framing and not parser.leftover
        if not parser.streaming:
            body = bytes(parser.kept_body)
            refused = context_exceeded(head.status, body)
            if refused is not None:
                result.n_prompt_tokens, result.n_ctx = refused.n_prompt_tokens, refused.n_ctx
                return result.fail("context_exceeded", f"HTTP 400: {refused.message}")
            return result.fail(*_not_a_stream(head, body))
        return result
    except TimeoutError:
        if waiting_first and result.bytes_received == 0:
            return result.fail(
                "timeout", f"no response within {first_byte_s:g} s (load.first_byte_timeout_s)"
            )
        return result.fail("timeout", "request deadline passed")
    except ProtocolError as error:
        return result.fail("protocol_error", str(error))
    except ssl.SSLError as error:
        return result.fail("connect_error", f"TLS: {error}")
    except OSError as error:
        if result.status is None and result.bytes_received == 0:
            return result.fail("connect_error", str(error) or repr(error))
        return result.fail("stream_cut", str(error) or repr(error))
    finally:
        if keep and result.error_class in (None, "http_4xx", "http_5xx", "not_streamed", "context_exceeded"):
            pool.give(sock)
        else:
            _close(sock)


def _not_a_stream(head: ResponseHead, body: bytes) -> tuple[str, str]:
    """The error class and message of a complete answer that is not an event stream."""
    text = body.decode("utf-8", "replace").strip()
    if head.status >= 400:
        return ("http_5xx" if head.status >= 500 else "http_4xx"), f"HTTP {head.status}: {text[:240]}"
    if head.status != 200:
        return "not_streamed", f"HTTP {head.status} {head.reason[:40]} instead of an event stream"
    if head.content_encoding != "identity":
        return "protocol_error", (
            f"the stream came with Content-Encoding {head.content_encoding[:40]!r} although the"
            " request asked for identity (a proxy in between?)"
        )
    media = head.media_type or "no Content-Type"
    if media == "application/json" or media.endswith("+json"):
        info = classify_payload(body)
        if info.kind == "error":
            return "server_error_event", f"HTTP 200 JSON error: {info.error}"
        if info.finish_reason is not None:
            return "not_streamed", (
                f"one JSON answer (finish_reason {info.finish_reason}) instead of an event stream:"
                ' the server ignored "stream": true'
            )
    return "not_streamed", f"HTTP 200 {media[:60]} instead of text/event-stream: {text[:120]}"
