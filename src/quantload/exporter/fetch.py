"""Reading many HTTP endpoints at once, each answer or failure back within one deadline."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field

import httpx

# Error classes, in the order a failure is recognised; also the `error` label values.
TIMEOUT = "timeout"
CONNECT = "connect"
AUTH = "auth"
HTTP_STATUS = "http_status"
PROTOCOL = "protocol"
PARSE = "parse"
ERROR_CLASSES: tuple[str, ...] = (TIMEOUT, CONNECT, AUTH, HTTP_STATUS, PROTOCOL, PARSE)

MAX_BODY_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class Request:
    """One GET: `key` names it in the answer."""

    key: tuple[str, str]
    url: str
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


class Fetcher:
    """Runs GETs on a small thread pool sharing one keep-alive client.

    A request still running from an earlier round is not started again: it counts as a timeout,
    so a server that hangs holds at most one thread per endpoint.
    """

    def __init__(
        self,
        timeout_s: float,
        max_workers: int,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.timeout_s = timeout_s
        self._client = httpx.Client(
            timeout=httpx.Timeout(timeout_s),
            transport=transport,
            follow_redirects=False,
            limits=httpx.Limits(max_connections=max_workers, max_keepalive_connections=max_workers),
        )
        self._pool = ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="ql-exporter")
        self._inflight: dict[tuple[str, str], Future[Fetched]] = {}
        self._lock = threading.Lock()

    def fetch_all(self, requests: Sequence[Request]) -> dict[tuple[str, str], Fetched]:
        """Start every request, wait at most `timeout_s`, and report each one."""
        started = time.monotonic()
        results: dict[tuple[str, str], Fetched] = {}
        futures: dict[tuple[str, str], Future[Fetched]] = {}
        with self._lock:
            for request in requests:
                running = self._inflight.get(request.key)
                if running is not None and not running.done():
                    results[request.key] = Fetched(
                        None, TIMEOUT, "the previous read has not finished", 0.0
                    )
                    continue
                future = self._pool.submit(self._get, request)
                self._inflight[request.key] = future
                futures[request.key] = future
        wait(futures.values(), timeout=self.timeout_s)
        for key, future in futures.items():
            if future.done():
                results[key] = future.result()
            else:
                elapsed = time.monotonic() - started
                results[key] = Fetched(
                    None, TIMEOUT, f"no answer within {self.timeout_s:g} s", elapsed
                )
        return results

    def _get(self, request: Request) -> Fetched:
        started = time.monotonic()
        try:
            body, error, detail = self._read(request)
        except httpx.TimeoutException as exc:
            body, error, detail = None, TIMEOUT, f"timed out ({type(exc).__name__})"
        except httpx.ConnectError as exc:
            body, error, detail = None, CONNECT, f"cannot connect ({_first_line(exc)})"
        except (httpx.HTTPError, UnicodeDecodeError) as exc:
            body, error, detail = None, PROTOCOL, f"{type(exc).__name__}: {_first_line(exc)}"
        return Fetched(body, error, detail, time.monotonic() - started)

    def _read(self, request: Request) -> tuple[str | None, str | None, str]:
        with self._client.stream("GET", request.url, headers=dict(request.headers)) as response:
            if response.status_code in (401, 403):
                return None, AUTH, f"HTTP {response.status_code}: check the API key"
            if response.status_code != 200:
                return None, HTTP_STATUS, f"HTTP {response.status_code}"
            chunks: list[bytes] = []
            size = 0
            for chunk in response.iter_bytes():
                size += len(chunk)
                if size > MAX_BODY_BYTES:
                    return None, PROTOCOL, f"body larger than {MAX_BODY_BYTES} bytes"
                chunks.append(chunk)
        return b"".join(chunks).decode("utf-8"), None, "ok"

    def close(self) -> None:
        """Stop the threads (without waiting for hung reads) and close the connections."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self._client.close()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
