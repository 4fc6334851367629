"""The per-request record (schema `quantload.record/1`) and the append-only files that hold them.

One JSON object per line in `records.jsonl`, written when the request ends (success or failure),
flushed at once, so a crash loses at most the requests still in flight.

Times: `*_unix_s` are wall-clock (time.time) for lining up with Prometheus; every duration
(`*_s`) is measured with time.perf_counter on the client. TTFT runs from the moment the request
bytes are handed to the socket (`sent_unix_s`) to the first chunk that carries generated text;
the connection is opened before that moment and is not inside TTFT (`connect_s` gives it apart).
In open loop, `*_from_intended_s` add the lag between the scheduled and the actual send
(coordinated-omission-corrected latency).

Fields
  schema              "quantload.record/1"
  run_id              the run this belongs to
  server, quant, model, url
  experiment          "sweep" (closed-loop users), "open_loop" (Poisson rate), "prefix_cache", "warmup"
  stage_users         concurrent users of the stage (closed loop), else null
  stage_rate_rps      target arrival rate (open loop), else null
  repeat              repeat index of the stage, from 0
  warmup              true for warm-up requests (excluded from statistics)
  cache_prompt        the `cache_prompt` value sent: the prompt-cache state of this request
  prompt_id           id of the prompt in its set
  worker              who sent it: "<host>:<pid>" (distinguishes Locust workers)
  intended_unix_s     when it was scheduled to be sent
  sent_unix_s         when it was actually sent
  lag_s               sent - intended (client schedule lag; > 0 means the client fell behind)
  connect_s           time to open the TCP connection (not part of TTFT)
  ttft_s              send -> first chunk with generated text
  ttft_from_intended_s
  e2e_s               send -> last byte of the stream
  e2e_from_intended_s
  tpot_s              (e2e - ttft) / (completion_tokens - 1), null when fewer than 2 tokens
  itl_count, itl_mean_s, itl_p50_s, itl_p99_s, itl_max_s   gaps between content chunks
  prompt_tokens, completion_tokens, cached_tokens          from the server's `usage`
  timings             the server's `timings` object as sent (prompt_ms, predicted_ms, cache_n, ...)
  finish_reason       "stop", "length", ... or null
  ok                  true when the request completed with a full stream and HTTP 200
  within_deadline     ok and e2e within the per-request deadline (goodput counts these)
  http_status         status code, null when none arrived
  error_class         null, or one of ERROR_CLASSES
  error               short error text
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

SCHEMA = "quantload.record/1"
Experiment = Literal["sweep", "open_loop", "prefix_cache", "warmup"]
ERROR_CLASSES: tuple[str, ...] = (
    "http_4xx",          # the server refused the request (400, 401, 404, ...)
    "http_5xx",          # 500, 503 ...
    "connect_refused",   # nothing listens
    "connect_error",     # other connection failure
    "stream_cut",        # the stream ended before [DONE] / the final usage chunk
    "malformed_chunk",   # a data line that is not valid JSON
    "server_error_event",  # the stream carried {"error": ...}
    "timeout",           # the per-request deadline passed
    "client_error",      # anything else raised inside the client
)


class RequestRecord(BaseModel):
    """One request as the client saw it, with the server's own timings beside it."""

    model_config = ConfigDict(extra="forbid")

    schema_: str = SCHEMA
    run_id: str
    server: str
    quant: str
    model: str
    url: str
    experiment: Experiment
    stage_users: int | None = None
    stage_rate_rps: float | None = None
    repeat: int = 0
    warmup: bool = False
    cache_prompt: bool
    prompt_id: str
    worker: str
    intended_unix_s: float
    sent_unix_s: float
    lag_s: float
    connect_s: float | None = None
    ttft_s: float | None = None
    ttft_from_intended_s: float | None = None
    e2e_s: float | None = None
    e2e_from_intended_s: float | None = None
    tpot_s: float | None = None
    itl_count: int = 0
    itl_mean_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    itl_max_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    timings: dict[str, float] | None = None
    finish_reason: str | None = None
    ok: bool
    within_deadline: bool
    http_status: int | None = None
    error_class: str | None = None
    error: str | None = None

    def to_json_line(self) -> str:
        data = self.model_dump(mode="json")
        data["schema"] = data.pop("schema_")
        return json.dumps(data, separators=(",", ":"))

    @classmethod
    def from_json_line(cls, line: str) -> RequestRecord:
        data = json.loads(line)
        data["schema_"] = data.pop("schema", SCHEMA)
        return cls.model_validate(data)


class JsonlAppender:
    """Appends one JSON line per call and flushes it to the OS at once; safe across threads.

    Flushing (not fsync) is enough for the promise we make: a crashed *process* loses nothing
    already appended; a crashed machine may lose what the OS had not yet written.
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._handle = path.open("a", encoding="utf-8")

    def append_line(self, line: str) -> None:
        with self._lock:
            self._handle.write(line + "\n")
            self._handle.flush()

    def append(self, record: RequestRecord) -> None:
        self.append_line(record.to_json_line())

    def append_obj(self, data: dict[str, Any]) -> None:
        self.append_line(json.dumps(data, separators=(",", ":"), default=str))

    def close(self) -> None:
        with self._lock:
            self._handle.close()


def iter_records(path: Path) -> Iterator[RequestRecord]:
    """Records from a JSONL file; a torn last line (crash mid-write) is skipped."""
    if not path.is_file():
        return
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            try:
                yield RequestRecord.from_json_line(line)
            except ValueError:
                continue
