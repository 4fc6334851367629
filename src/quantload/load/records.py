"""Per-request records (schema `quantload.record/1`) and stage events, one JSON object per line.

`records.jsonl` gets one line per request when it ends (success or failure), flushed at once, so a
crash loses at most the requests still in flight. `stages.jsonl` gets a `stage_start` line when a
stage's measured requests are released (after its users are spawned and its warm-up requests are
done) and a `stage_end` line when the last of them has completed; a stage that never ran (an
earlier one failed) gets only a `stage_end` line with status "aborted". On `stage_start` lines
status is "ok" (started); on `stage_end` lines "ok", "failed" (circuit breaker, stage timeout) or
"aborted" (not run, or the load process died). Both files are written only by the process that
drives the stages (the local runner or the Locust master): workers send their records to it.

Times: `*_unix_s` are wall-clock (time.time) for lining up with Prometheus; every duration (`*_s`)
is measured with time.perf_counter on the client. TTFT runs from the moment the request bytes are
handed to the socket to the arrival of the first chunk carrying generated text (role-only chunks,
SSE comments and empty deltas do not count); arrival is the kernel's receive time of those bytes
where the platform gives it (Linux), else the moment the client's read returned. Connecting is
*not* inside TTFT: a fresh connection is opened before the clock starts (llama-server closes the
connection after every streamed response, so there usually is one) and `connect_s` gives its time
apart. In open loop, `*_from_intended_s` add the lag between the scheduled and the actual send
(latency corrected for coordinated omission); in closed loop the intended time is when the user
took the request.

Request record fields
  schema              "quantload.record/1"
  run_id              the run this belongs to
  server, quant, model, url
  experiment          the name of the experiment that sent it (quantload.experiments.registry:
                      each module there says what its stages send), or "interactive" (users set
                      in the Locust web UI); "warmup" is accepted on read
  stage_id            joins the record to its stage lines in stages.jsonl
  stage_users         concurrent users of the stage (closed loop; open loop: the user pool)
  stage_rate_rps      target arrival rate (open loop), else null
  repeat              repeat index of the stage, from 0
  warmup              true for warm-up requests (excluded from statistics)
  cache_prompt        the `cache_prompt` value sent: the prompt-cache state of this request
  prompt_id           id of the prompt in its set
  max_tokens, ignore_eos   the output-length controls sent (the asked output length; the
                      delivered one is completion_tokens)
  prompt_tokens_asked the prompt length (whole templated prompt, tokens) the workload asked for,
                      null where it asked for none (a prompt set, a conversation's later turns);
                      the delivered length is prompt_tokens
  workload            what the stage sent: "prompts", "lengths", "dataset", "trace", "sessions"
  request_class       the mixed experiment's class of request: "decode" or "long_prompt"
  session_id, turn    a multi-turn conversation and the turn within it (from 0)
  id_slot             the llama-server slot the request asked for (session affinity), else null
  tenant              the tenant ([[tenants]]) whose traffic this request is, else null
  trimmed_turns       the client's history trim (context experiment, policy trim): how many of
                      the conversation's earliest turns this request's history left out (0: none),
                      null where the stage does not trim
  trimmed_tokens      the tokens those left-out turns held, as counted with the server's tokenizer
  worker              who sent it: "<host>:<pid>" (distinguishes Locust workers)
  intended_unix_s     when it was scheduled to be sent
  sent_unix_s         when it was actually sent
  lag_s               sent - intended (client schedule lag; > 0 means the client fell behind)
  connect_s           time to open the TCP connection (not part of TTFT); null when reused
  connection_reused   whether a kept-alive connection carried the request
  arrival_clock       where the client's arrival times come from: "kernel" (the kernel's receive
                      time of every read), "read" (when each read returned: no kernel stamps on
                      this platform or connection, or the kernel's stamping was not on yet),
                      "mixed", null when nothing arrived
  ttfb_s              send -> response head
  ttft_s              send -> first chunk with generated text of any kind (reasoning counts)
  ttft_content_s      send -> first chunk of answer content (not reasoning); equals ttft_s for
                      a model that does not reason, null when no answer content came
  reasoning_chunks    chunks that carried reasoning text (`delta.reasoning_content`)
  ttft_from_intended_s
  e2e_s               send -> last byte of the stream
  e2e_from_intended_s
  tpot_s              (e2e - ttft) / (completion_tokens - 1), null when fewer than 2 tokens
  itl_s               every gap between consecutive content chunks, seconds (rounded to 1 us)
  itl_count, itl_mean_s, itl_p50_s, itl_p99_s, itl_max_s   summary of itl_s
  content_chunks      chunks that carried generated text
  prompt_tokens, completion_tokens, cached_tokens          from the server's `usage`
  timings             the server's `timings` object as sent (prompt_ms, predicted_ms, cache_n, ...)
  finish_reason       "stop", "length", ... or null
  truncated           true when the reply stopped because the slot's context was full: finish
                      "length" before the asked max_tokens (llama-server's `truncated`; a chat
                      stream does not carry the flag, so it is read from these two)
  context_shifted     true when prompt + reply reached the slot's context and the reply still
                      came whole: the server shifted its context (`--context-shift`); null where
                      the stage does not know the slot's context
  n_prompt_tokens, n_ctx   a `context_exceeded` refusal's two counts as llama-server sent them:
                      the whole prompt's tokens and the slot's context
  ok                  true when the request completed with a full stream and HTTP 200
  within_deadline     ok and e2e_from_intended_s within the per-request deadline (one half of
                      goodput: the other is the SLO, quantload.slo)
  http_status         status code, null when none arrived
  error_class         null, or one of ERROR_CLASSES
  error               short error text

Stage event fields (stages.jsonl): see `StageEvent`.
Changes within quantload.record/1 (additive, readers ignore what they do not know): stage_id,
max_tokens, ignore_eos, connection_reused, ttfb_s, itl_s, content_chunks; experiment
"interactive"; error classes protocol_error and aborted; ttft_content_s, reasoning_chunks,
prompt_tokens_asked, workload, request_class, session_id, turn, id_slot; the experiments added
since; error class session_cut; arrival_clock; tenant, trimmed_turns, trimmed_tokens, truncated,
context_shifted, n_prompt_tokens, n_ctx, error class context_exceeded. Stage lines within
quantload.stage/1: client_cpu_total_frac, workload, phase, server_args, warning,
template_overhead_tokens, arrival ("closed", "poisson" or "trace": how the stage's requests were
sent, which decides whether latency counts from the intended send time; older lines have none and
are read as open loop when they have a rate), tenants, context_policy, slot_context_tokens,
client_rss_bytes, client_trust, client_trust_why; a timed stage's (a soak slice's) stage_end line
gives as requests_planned the requests it handed out.
Experiment names are read as text: any experiment of quantload.experiments.registry, and names a
later quantload adds.
"""

from __future__ import annotations

__all__ = ["JsonlAppender", "RequestRecord", "StageEvent", "TenantLoad", "iter_records", "iter_stage_events"]

import json
import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal, Self, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from quantload.rundir.jsonl import BadLines, iter_jsonl

SCHEMA = "quantload.record/1"
STAGE_SCHEMA = "quantload.stage/1"
# An experiment's name (quantload.experiments.registry), "interactive" (users set in the Locust web
# UI) or "warmup" (accepted on read). Any name is read: a record outlives the code that wrote it.
Experiment = str
StageStatus = Literal["ok", "failed", "aborted"]
ERROR_CLASSES: tuple[str, ...] = (
    "context_exceeded",  # HTTP 400 exceed_context_size_error: the prompt fills the slot's context
    "http_4xx",  # the server refused the request (400, 401, 404, ...)
    "http_5xx",  # 500, 503 ...
    "not_streamed",  # an answer that is not an event stream: a JSON reply, a 204, a redirect
    "connect_refused",  # nothing listens
    "connect_error",  # other connection failure, or closed before any response
    "stream_cut",  # the stream ended before [DONE] / finish_reason
    "malformed_chunk",  # a data line that is not valid JSON
    "server_error_event",  # the stream carried {"error": ...}
    "protocol_error",  # bytes that are not valid HTTP/1.1 framing
    "timeout",  # the per-request deadline passed
    "aborted",  # the load process stopped while the request was in flight
    "session_cut",  # not sent: an earlier turn of its conversation failed
    "client_error",  # anything else raised inside the client
)


class _JsonLine(BaseModel):
    """A model stored as one compact JSON line (the `schema` key, not `schema_`)."""

    def to_json_line(self) -> str:
        """This object as one JSON line."""
        return self.model_dump_json(by_alias=True)

    @classmethod
    def from_json_line(cls, line: str) -> Self:
        """Parse one line written by `to_json_line`."""
        return cls.model_validate_json(line)


class RequestRecord(_JsonLine):
    """One request as the client saw it, with the server's own timings beside it."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    schema_: str = Field(default=SCHEMA, alias="schema")
    run_id: str
    server: str
    quant: str
    model: str
    url: str
    experiment: Experiment
    stage_id: str | None = None
    stage_users: int | None = None
    stage_rate_rps: float | None = None
    repeat: int = 0
    warmup: bool = False
    cache_prompt: bool
    prompt_id: str
    max_tokens: int | None = None
    ignore_eos: bool | None = None
    prompt_tokens_asked: int | None = None
    workload: str | None = None
    request_class: str | None = None
    session_id: str | None = None
    turn: int | None = None
    id_slot: int | None = None
    tenant: str | None = None
    trimmed_turns: int | None = None
    trimmed_tokens: int | None = None
    worker: str
    intended_unix_s: float
    sent_unix_s: float
    lag_s: float
    connect_s: float | None = None
    connection_reused: bool | None = None
    arrival_clock: str | None = None
    ttfb_s: float | None = None
    ttft_s: float | None = None
    ttft_content_s: float | None = None
    reasoning_chunks: int = 0
    ttft_from_intended_s: float | None = None
    e2e_s: float | None = None
    e2e_from_intended_s: float | None = None
    tpot_s: float | None = None
    itl_s: list[float] | None = None
    itl_count: int = 0
    itl_mean_s: float | None = None
    itl_p50_s: float | None = None
    itl_p99_s: float | None = None
    itl_max_s: float | None = None
    content_chunks: int = 0
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    timings: dict[str, float] | None = None
    finish_reason: str | None = None
    truncated: bool | None = None
    context_shifted: bool | None = None
    n_prompt_tokens: int | None = None
    n_ctx: int | None = None
    ok: bool
    within_deadline: bool
    http_status: int | None = None
    error_class: str | None = None
    error: str | None = None


class RecordOutcome(_JsonLine):
    """The part of a records.jsonl line that says how a stage is getting on.

    Read instead of the whole record where only progress matters: the load supervisor counting
    measured requests, the Locust master counting a worker's records for the circuit breaker.
    """

    model_config = ConfigDict(extra="ignore")

    stage_id: str | None = None
    warmup: bool = False
    ok: bool
    error_class: str | None = None
    within_deadline: bool = True
    ttft_s: float | None = None
    ttft_from_intended_s: float | None = None
    tpot_s: float | None = None
    e2e_s: float | None = None

    @classmethod
    def of(cls, record: RequestRecord) -> RecordOutcome:
        """The outcome part of a whole record."""
        return cls(
            stage_id=record.stage_id, warmup=record.warmup, ok=record.ok, error_class=record.error_class,
            within_deadline=record.within_deadline, ttft_s=record.ttft_s,
            ttft_from_intended_s=record.ttft_from_intended_s, tpot_s=record.tpot_s, e2e_s=record.e2e_s,
        )  # fmt: skip


class TenantLoad(BaseModel):
    """One tenant's share of a stage: its closed-loop users or its open-loop rate (and the users
    serving it), and the requests it was given."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    name: str
    users: int
    rate_rps: float | None = None
    requests: int = 0


class StageEvent(_JsonLine):
    """One line of stages.jsonl: a stage started or ended.

    Beyond the fields every reader relies on (event ... reason), a stage_end line carries the
    client's own health during the stage: `client_cpu_frac` (busiest load process, fraction of one
    core), `client_cpu_total_frac` (every load process added up, master included: 2.0 = two
    cores' worth), `loop_lag_p99_s`/`loop_lag_max_s` (how late the load process's event loop woke up),
    `client_saturated` (true when those say the client itself may have been the bottleneck),
    `client_trust` and `client_trust_why` (how far the stage's figures can be trusted: "ok",
    "degraded" when they may be worse than the error the client is stated within, "saturated";
    and why) and `client_rss_bytes` (every load process's resident memory at the stage's end,
    added up).
    Stages of the newer experiments also say what they sent (`workload`), which part of their
    experiment they are (`phase`, e.g. the mixed experiment's "alone" and "mixed"), the server flags
    they ran under (`server_args`, e.g. "-b 256 -ub 256"), what was wrong with them before they
    started (`warning`, e.g. more users than requests) and the chat template's own tokens around a
    user turn (`template_overhead_tokens`). A stage shared by tenants lists each one's load
    (`tenants`); the context experiment's stages say how a history beyond the slot was met
    (`context_policy`: fail, trim or shift) and the slot's context (`slot_context_tokens`).
    """

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    schema_: str = Field(default=STAGE_SCHEMA, alias="schema")
    event: Literal["stage_start", "stage_end"]
    unix_s: float
    run_id: str
    server: str
    quant: str
    model: str = ""
    url: str = ""
    experiment: Experiment
    stage_id: str
    stage_index: int
    stage_users: int | None = None
    stage_rate_rps: float | None = None
    repeat: int = 0
    cache_prompt: bool
    kv_cache_type: str | None = None  # the server's K and V cache type (the kv_types experiment)
    arrival: str | None = None  # "closed", "poisson" or "trace" (quantload.slo.Arrival); None: older run
    requests_planned: int
    requests_done: int = 0
    requests_ok: int = 0
    warmup_requests: int = 0
    status: StageStatus = "ok"
    reason: str | None = None
    workers: int = 0
    prefix_tokens: int | None = None
    server_state: str | None = None
    workload: str | None = None
    phase: str | None = None
    server_args: str | None = None
    warning: str | None = None
    template_overhead_tokens: int | None = None
    tenants: list[TenantLoad] | None = None
    context_policy: str | None = None
    slot_context_tokens: int | None = None
    client_cpu_frac: float | None = None
    client_cpu_total_frac: float | None = None
    loop_lag_p99_s: float | None = None
    loop_lag_max_s: float | None = None
    client_saturated: bool | None = None
    client_trust: str | None = None  # quantload.load.client_health.ClientTrust: ok, degraded, saturated
    client_trust_why: str | None = None
    client_rss_bytes: int | None = None
    client_error_s: float | None = None  # the timing error the client is stated within (its calibration)
    level_outcome: str | None = None  # a decided stage: its level's verdict at its end (quantload.slo)
    level_requests: int | None = None  # the requests that verdict rested on (its level's stages so far)


class JsonlAppender:
    """Appends one JSON line per call with a single `write` on an O_APPEND descriptor.

    One write per line means a line is never interleaved with another process appending to the
    same file (two load runs against two servers at once), and a crashed process loses nothing
    already appended; a crashed machine may lose what the OS had not yet written (no fsync).
    """

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._fd: int | None = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def append_line(self, line: str) -> None:
        """Append `line` (without its newline)."""
        data = (line + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"{self.path} is closed")
            view = memoryview(data)
            while view:
                written = os.write(self._fd, view)
                view = view[written:]

    def append(self, record: RequestRecord | StageEvent) -> None:
        """Append a record or a stage event."""
        self.append_line(record.to_json_line())

    def append_obj(self, data: dict[str, Any]) -> None:
        """Append any JSON-serialisable dict."""
        self.append_line(json.dumps(data, separators=(",", ":"), default=str))

    def close(self) -> None:
        """Close the file; later appends fail."""
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


_LineT = TypeVar("_LineT", bound=_JsonLine)


def _iter_json_lines(path: Path, line_type: type[_LineT], bad: BadLines | None = None) -> Iterator[_LineT]:
    """Objects of `line_type` from a JSONL file; a line that does not parse (a torn last line) is
    counted in `bad` (`quantload.rundir.jsonl`, the rule every run file is read by)."""
    return iter_jsonl(path, line_type.from_json_line, bad)


def iter_records(path: Path, bad: BadLines | None = None) -> Iterator[RequestRecord]:
    """Records from a JSONL file; a torn last line (crash mid-write) is counted in `bad`."""
    return _iter_json_lines(path, RequestRecord, bad)


def iter_stage_events(path: Path, bad: BadLines | None = None) -> Iterator[StageEvent]:
    """Stage events from stages.jsonl; torn lines are counted in `bad`."""
    return _iter_json_lines(path, StageEvent, bad)
