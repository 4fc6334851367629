"""Reading every target's endpoints at once, each answer or failure back within one deadline.

One task per target reads its endpoints one after the other over a single kept-alive connection
(llama-server gives each open connection one of its HTTP threads, so the exporter holds at most
one per server); tasks for different targets run concurrently. The stdlib `http.client` is used
because a scrape makes several small requests and its per-request cost is a third of httpx's.
"""

from __future__ import annotations

import http.client
import socket
import ssl
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from urllib.parse import urlsplit

# Error classes; also the values of the `error` label.
TIMEOUT = "timeout"
CONNECT = "connect"
AUTH = "auth"
HTTP_STATUS = "http_status"
PROTOCOL = "protocol"
PARSE = "parse"
ERROR_CLASSES: tuple[str, ...] = (TIMEOUT, CONNECT, AUTH, HTTP_STATUS, PROTOCOL, PARSE)

# llama-server answers 503 {"error": {"message": "Loading model", ...}} while it starts: a planned
# restart, not trouble (logged at INFO, still counted as an http_status error and up 0)
LOADING_MARK = b"Loading model"
LOADING_DETAIL = "HTTP 503: the server is loading its model"
MAX_BODY_BYTES = 4 * 1024 * 1024
READ_CHUNK = 64 * 1024
GRACE_S = 0.05


@dataclass(frozen=True)
class TargetRequest:
    """The endpoints (paths) to GET from one server, in order, with the same headers."""

    name: str
    base_url: str
    paths: Sequence[str]
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Fetched:
    """A body, or the class of the failure and one line saying what happened."""

    body: str | None
    error: str | None
    detail: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.error is None


class _Failure(Exception):
    def __init__(self, error: str, detail: str) -> None:
        super().__init__(detail)
        self.error = error
        self.detail = detail


class _Connection:
    """One kept-alive connection to one server, used by one task at a time."""

    def __init__(self, base_url: str) -> None:
        parts = urlsplit(base_url)
        self.https = parts.scheme == "https"
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or (443 if self.https else 80)
        self.prefix = parts.path.rstrip("/")
        self._conn: http.client.HTTPConnection | None = None

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def _open(self, timeout_s: float) -> http.client.HTTPConnection:
        if self._conn is None:
            if self.https:
                context = ssl.create_default_context()
                self._conn = http.client.HTTPSConnection(
                    self.host, self.port, timeout=timeout_s, context=context
                )
            else:
                self._conn = http.client.HTTPConnection(self.host, self.port, timeout=timeout_s)
            try:
                self._conn.connect()
            except OSError as exc:
                self.close()
                kind = TIMEOUT if isinstance(exc, TimeoutError) else CONNECT
                raise _Failure(kind, f"cannot connect ({_first_line(exc)})") from None
            self._conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._conn.sock.settimeout(timeout_s)
        return self._conn

    def get(self, path: str, headers: Mapping[str, str], deadline: float) -> str:
        """The body of a 200 answer to GET `path`; _Failure otherwise."""
        reused = self._conn is not None
        try:
            return self._get(path, headers, deadline)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            self.close()
            if not reused:
                raise _Failure(PROTOCOL, "the server closed the connection") from None
        # A kept-alive connection the server had closed: one fresh attempt.
        try:
            return self._get(path, headers, deadline)
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            self.close()
            raise _Failure(PROTOCOL, "the server closed the connection") from None

    def _get(self, path: str, headers: Mapping[str, str], deadline: float) -> str:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Failure(TIMEOUT, "no time left in this scrape")
        conn = self._open(remaining)
        try:
            conn.request("GET", self.prefix + path, headers=dict(headers))
            response = conn.getresponse()
            body = self._read(response, deadline)
        except TimeoutError:
            self.close()
            raise _Failure(TIMEOUT, "no answer in time") from None
        except (http.client.RemoteDisconnected, BrokenPipeError, ConnectionResetError):
            raise
        except (http.client.HTTPException, OSError) as exc:
            self.close()
            raise _Failure(PROTOCOL, f"{type(exc).__name__}: {_first_line(exc)}") from None
        if response.will_close:
            self.close()
        if response.status in (401, 403):
            raise _Failure(AUTH, f"HTTP {response.status}: check the API key")
        if response.status == 503 and LOADING_MARK in body[:4096]:
            raise _Failure(HTTP_STATUS, LOADING_DETAIL)
        if response.status != 200:
            raise _Failure(HTTP_STATUS, f"HTTP {response.status}")
        try:
            return body.decode("utf-8")
        except UnicodeDecodeError:
            raise _Failure(PARSE, "the answer is not UTF-8 text") from None

    def _read(self, response: http.client.HTTPResponse, deadline: float) -> bytes:
        chunks: list[bytes] = []
        size = 0
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.close()
                raise _Failure(TIMEOUT, "the answer did not finish in time")
            if self._conn is not None and self._conn.sock is not None:
                self._conn.sock.settimeout(remaining)
            chunk = response.read1(READ_CHUNK)
            if not chunk:
                response.close()  # marks the answer consumed, so the connection can be reused
                return b"".join(chunks)
            size += len(chunk)
            if size > MAX_BODY_BYTES:
                self.close()
                raise _Failure(PROTOCOL, f"answer larger than {MAX_BODY_BYTES} bytes")
            chunks.append(chunk)


class Fetcher:
    """Runs one task per target on a small thread pool; see the module docstring.

    A target whose previous task is still running is not read again: its endpoints count as
    timeouts, so a server that hangs holds at most one thread.
    """

    def __init__(self, timeout_s: float, max_workers: int) -> None:
        self.timeout_s = timeout_s
        self.max_workers = max_workers
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="ql-exporter")
        self._connections: dict[str, _Connection] = {}
        self._inflight: dict[str, Future[dict[str, Fetched]]] = {}
        self._lock = threading.Lock()

    def fetch_all(self, requests: Sequence[TargetRequest]) -> dict[tuple[str, str], Fetched]:
        """Read every target's paths; the answer has an entry for each (target, path)."""
        started = time.monotonic()
        deadline = started + self.timeout_s
        results: dict[tuple[str, str], Fetched] = {}
        futures: dict[str, tuple[TargetRequest, Future[dict[str, Fetched]]]] = {}
        with self._lock:
            for request in requests:
                running = self._inflight.get(request.name)
                if running is not None and not running.done():
                    for path in request.paths:
                        detail = "the previous read has not finished"
                        results[(request.name, path)] = Fetched(None, TIMEOUT, detail, 0.0)
                    continue
                try:
                    connection = self._connections.get(request.name) or _Connection(request.base_url)
                except ValueError as error:  # a URL the start-up check let through: this target only
                    for path in request.paths:
                        results[(request.name, path)] = Fetched(None, CONNECT, f"bad URL ({error})", 0.0)
                    continue
                self._connections[request.name] = connection
                future = self._pool.submit(_read_target, connection, request, deadline)
                self._inflight[request.name] = future
                futures[request.name] = (request, future)
        # Each task stops itself at the deadline; the grace lets it report how it failed.
        wait([future for _, future in futures.values()], timeout=self.timeout_s + GRACE_S)
        detail = f"no answer within {self.timeout_s:g} s"
        for name, (request, future) in futures.items():
            answers = _answers(future, request.paths)
            # Paths are read one after another: the time already spent goes to the first one
            # missing, so a target's durations add up to the time it took.
            spent = time.monotonic() - started - sum(a.duration_s for a in answers.values())
            for path in request.paths:
                if path not in answers:
                    answers[path] = Fetched(None, TIMEOUT, detail, max(spent, 0.0))
                    spent = 0.0
                results[(name, path)] = answers[path]
        return results

    def forget(self, names: Iterable[str]) -> None:
        """Drop the connections of targets no longer read (closed unless a read still uses them)."""
        with self._lock:
            for name in names:
                connection = self._connections.pop(name, None)
                running = self._inflight.pop(name, None)
                if connection is not None and (running is None or running.done()):
                    connection.close()

    def close(self) -> None:
        """Stop the threads (without waiting for hung reads) and close the connections."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        with self._lock:
            for connection in self._connections.values():
                connection.close()


def _answers(future: Future[dict[str, Fetched]], paths: Sequence[str]) -> dict[str, Fetched]:
    """What a finished task read; nothing for a running one. A task that raised (a bug, not a
    server fault) fails its own target's paths, never the whole scrape."""
    if not future.done():
        return {}
    try:
        return future.result()
    except Exception as error:
        detail = f"internal error: {type(error).__name__}: {str(error)[:120]}"
        return {path: Fetched(None, PROTOCOL, detail, 0.0) for path in paths}


def _read_target(connection: _Connection, request: TargetRequest, deadline: float) -> dict[str, Fetched]:
    answers: dict[str, Fetched] = {}
    for path in request.paths:
        started = time.monotonic()
        try:
            body = connection.get(path, request.headers, deadline)
            answers[path] = Fetched(body, None, "ok", time.monotonic() - started)
        except _Failure as failure:
            duration = time.monotonic() - started
            answers[path] = Fetched(None, failure.error, failure.detail, duration)
            if failure.error in (CONNECT, TIMEOUT):
                for rest in request.paths[len(answers) :]:
                    answers[rest] = Fetched(None, failure.error, failure.detail, 0.0)
                break
    return answers


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    text = lines[0][:200] if lines else type(exc).__name__
    return "".join(ch if ch.isprintable() else "?" for ch in text)
