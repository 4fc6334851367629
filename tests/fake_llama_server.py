"""An in-process stand-in for llama-server's `/metrics`, `/slots` and `/props`, with faults.

Imported as `fake_llama_server` (tests/ is on pytest's pythonpath) by the exporter's tests and the
observability fault tests, and by benchmarks/exporter_scrape.py: no llama.cpp needed, timing
and faults scripted. Test-only: it is not part of the installed package.

Behaviour is scripted through attributes that a test may change while it runs:
`metrics_text`, `slots` (or `slots_body`: raw bytes), `props`, `delay_s` (before every answer), `mode` ("ok", "garbage",
"http500", "not_http", "trickle": the body one byte every 50 ms), `api_key` (answers 401
without `Authorization: Bearer <key>`).
"""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

METRICS_TEMPLATE = """\
# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed, excluding cached tokens
# TYPE llamacpp:prompt_tokens_total counter
llamacpp:prompt_tokens_total {prompt_tokens}
# HELP llamacpp:prompt_tokens_cached_total Number of prompt tokens reused from the cache
# TYPE llamacpp:prompt_tokens_cached_total counter
llamacpp:prompt_tokens_cached_total 0
# HELP llamacpp:prompt_seconds_total Total time spent processing prompts
# TYPE llamacpp:prompt_seconds_total counter
llamacpp:prompt_seconds_total 1.5
# HELP llamacpp:tokens_predicted_total Number of generation tokens processed
# TYPE llamacpp:tokens_predicted_total counter
llamacpp:tokens_predicted_total {predicted}
# HELP llamacpp:tokens_predicted_seconds_total Total time spent generating tokens
# TYPE llamacpp:tokens_predicted_seconds_total counter
llamacpp:tokens_predicted_seconds_total 2.25
# HELP llamacpp:n_decode_total Total number of llama_decode() calls
# TYPE llamacpp:n_decode_total counter
llamacpp:n_decode_total 42
# HELP llamacpp:n_tokens_max Largest observed sequence length (prompt + generation)
# TYPE llamacpp:n_tokens_max counter
llamacpp:n_tokens_max 1.23457e+06
# HELP llamacpp:prompt_tokens_seconds Average prompt throughput in tokens/s
# TYPE llamacpp:prompt_tokens_seconds gauge
llamacpp:prompt_tokens_seconds 812.5
# HELP llamacpp:predicted_tokens_seconds Average generation throughput in tokens/s
# TYPE llamacpp:predicted_tokens_seconds gauge
llamacpp:predicted_tokens_seconds 95.25
# HELP llamacpp:requests_processing Number of requests processing
# TYPE llamacpp:requests_processing gauge
llamacpp:requests_processing {processing}
# HELP llamacpp:requests_deferred Number of requests deferred
# TYPE llamacpp:requests_deferred gauge
llamacpp:requests_deferred {deferred}
# HELP llamacpp:n_busy_slots_per_decode Average number of busy slots per llama_decode() call
# TYPE llamacpp:n_busy_slots_per_decode gauge
llamacpp:n_busy_slots_per_decode 1.5
"""


def metrics_text(
    prompt_tokens: int = 100, predicted: int = 200, processing: int = 2, deferred: int = 1
) -> str:
    """A `/metrics` body in llama-server's exact format."""
    return METRICS_TEMPLATE.format(
        prompt_tokens=prompt_tokens, predicted=predicted, processing=processing, deferred=deferred
    )


def slots_payload(n_slots: int = 8, busy: int = 2, tokens: int = 100, n_ctx: int = 4096) -> list[Any]:
    """A `/slots` body: `busy` slots processing and holding `tokens` each, one idle slot that
    worked before (holding `tokens // 2`), the rest never used."""
    slots: list[Any] = []
    for slot_id in range(n_slots):
        entry: dict[str, Any] = {"id": slot_id, "n_ctx": n_ctx, "speculative": False}
        entry["is_processing"] = slot_id < busy
        if slot_id <= busy:
            held = tokens if slot_id < busy else tokens // 2
            entry.update(
                id_task=slot_id + 10,
                n_prompt_tokens=held,
                n_prompt_tokens_processed=held - 4,
                n_prompt_tokens_cache=0,
                params={"n_predict": 16, "stream": True},
                next_token=[{"has_next_token": True, "n_remain": 8, "n_decoded": 8}],
            )
        slots.append(entry)
    return slots


class FakeLlamaServer:
    """A threaded HTTP server on 127.0.0.1 that answers like llama-server."""

    def __init__(self) -> None:
        self.metrics_text = metrics_text()
        self.slots: Any = slots_payload()
        self.slots_body: bytes | None = None
        self.props: Any = {
            "model_path": "/models/tiny-Q8_0.gguf",
            "model_ftype": "Q8_0",
            "total_slots": 8,
        }
        self.delay_s = 0.0
        self.mode = "ok"
        self.api_key: str | None = None
        self.model_size_bytes: int | None = None  # /v1/models answers 404 while None
        self.reads: dict[str, int] = {}
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def start(self) -> FakeLlamaServer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    def count(self, path: str) -> None:
        with self._lock:
            self.reads[path] = self.reads.get(path, 0) + 1

    def answer(self, path: str, headers: dict[str, str]) -> tuple[int, str, bytes]:
        """Status, content type and body for a GET of `path`."""
        if self.api_key and headers.get("authorization") != f"Bearer {self.api_key}":
            return 401, "application/json", b'{"error":{"code":401,"message":"Invalid API Key"}}'
        if self.mode == "http500":
            return 500, "application/json", b'{"error":{"code":500}}'
        if self.mode == "loading":  # what llama-server answers while it loads its model
            return 503, "application/json", b'{"error":{"code":503,"message":"Loading model","type":"unavailable_error"}}'
        if self.mode == "garbage":
            return 200, "text/plain", b"<html><body>this is not it</body></html>\n\x00\x01"
        if path == "/metrics":
            return 200, "text/plain; version=0.0.4", self.metrics_text.encode()
        if path == "/slots":
            body = self.slots_body if self.slots_body is not None else json.dumps(self.slots).encode()
            return 200, "application/json", body
        if path == "/props":
            return 200, "application/json", json.dumps(self.props).encode()
        if path == "/v1/models" and self.model_size_bytes is not None:  # llama-server's meta.size
            body = {"object": "list", "data": [{"id": "m", "meta": {"size": self.model_size_bytes}}]}
            return 200, "application/json", json.dumps(body).encode()
        return 404, "application/json", b'{"error":{"code":404}}'


def _handler_for(fake: FakeLlamaServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # Headers and body go out in two writes; on a kept-alive connection Nagle's
            # algorithm would hold the body back until the client's delayed ACK (~40 ms).
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            fake.count(path)
            if fake.delay_s:
                time.sleep(fake.delay_s)
            if fake.mode == "not_http":
                self.wfile.write(b"\x16\x03\x01 definitely not HTTP\r\n\r\n")
                self.close_connection = True
                return
            status, content_type, body = fake.answer(path, {k.lower(): v for k, v in self.headers.items()})
            try:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if fake.mode == "trickle":
                    for index in range(len(body)):
                        self.wfile.write(body[index : index + 1])
                        self.wfile.flush()
                        time.sleep(0.05)
                else:
                    self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:
            return

    return Handler
