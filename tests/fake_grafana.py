"""A fake Grafana for the annotation tests: the two endpoints the push uses, on 127.0.0.1.

Imported as `fake_grafana` (tests/ is on pytest's pythonpath): by the observe unit tests (their
`grafana` fixture) and by the shared `ci_run`, which checks that `quantload run` pushes too.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Seen:
    """One request the fake Grafana received."""

    method: str
    path: str
    auth: str | None
    body: dict[str, Any] | None


class FakeGrafana:
    """`GET /api/frontend/settings` (grafana-client's health check) and `POST /api/annotations`,
    served from a thread on 127.0.0.1, recording every request it answers 200.

    Checks the Authorization header like Grafana (401 unless it equals `expected_auth`, when that
    is set); `garbage=True` answers HTML instead of JSON. Bounded: it answers at most
    `max_requests` (then 503), and stops itself after `lifetime_s` even if a test forgets to.
    """

    def __init__(
        self,
        expected_auth: str | None = None,
        garbage: bool = False,
        max_requests: int = 200,
        lifetime_s: float = 120.0,
    ) -> None:
        self.expected_auth = expected_auth
        self.garbage = garbage
        self.max_requests = max_requests
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        self._timer = threading.Timer(lifetime_s, self.close)
        self._timer.daemon = True
        self._timer.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def annotations(self) -> list[Seen]:
        """The annotations it took (POSTs that were answered 200)."""
        with self._lock:
            return [s for s in self.seen if s.method == "POST" and s.path == "/api/annotations"]

    def close(self) -> None:
        """Stop serving and free the port; safe to call more than once."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._timer.cancel()
        self.httpd.shutdown()
        self.httpd.server_close()
        self._thread.join(5)

    def _record(self, seen: Seen) -> tuple[int, dict[str, Any] | str]:
        with self._lock:
            if len(self.seen) >= self.max_requests:
                return 503, {"message": "fake Grafana: request limit reached"}
            if self.expected_auth is not None and seen.auth != self.expected_auth:
                return 401, {"message": "Unauthorized"}
            if self.garbage:
                return 200, "<html>not Grafana</html>"
            if seen.method == "GET" and seen.path == "/api/frontend/settings":  # health.check()
                self.seen.append(seen)
                return 200, {"buildInfo": {"version": "12.3.1"}}
            if seen.method == "POST" and seen.path == "/api/annotations":
                self.seen.append(seen)
                return 200, {"id": len(self.seen), "message": "Annotation added"}
            return 404, {"message": "Not found"}

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self._answer(None)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self._answer(json.loads(self.rfile.read(length) or b"{}"))

            def _answer(self, body: dict[str, Any] | None) -> None:
                seen = Seen(self.command, self.path, self.headers.get("Authorization"), body)
                status, payload = fake._record(seen)
                is_text = isinstance(payload, str)
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "text/html" if is_text else "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                return

        return Handler
