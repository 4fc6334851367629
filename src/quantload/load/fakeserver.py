"""A fake OpenAI-style streaming server of known timing, with faults: what `quantload calibrate`
measures the client against, and what the tests and benchmarks stream from.

Each request to `POST /v1/chat/completions` gets a script: a time to first token, a constant
inter-token gap and a token count, drawn from seeded ranges or set per request by a directive in
the prompt text, e.g. `[[fake ttft_ms=300 itl_ms=10 tokens=5 fault=cut_after:3]]`. The scripted
values come back in the last chunk's `timings` (`prompt_ms` = scripted TTFT,
`predicted_per_token_ms` = scripted gap), so a client's error on every request is exact:
measured minus scripted. Clocks start when the request body has been read. The server's own
lateness in sending the first token (its event loop is busy too) is reported as
`timings.first_token_late_ms`, and when it had read the request as `timings.request_received_unix_s`
(wall clock), so a benchmark can tell a late server from a late client; every
token's lateness is also kept and summarized by `GET /stats` (`?reset=1` starts a new window);
`GET /script` answers the script itself, so a client on another host can check what it runs.

Every stream also carries what real servers send and careless clients trip on (switch off with
`pathological=False`): a role-only first chunk sent at once, an SSE comment (`: keep-alive`), an
empty-content delta, and content chunks alternating compact and spaced JSON.

Faults (directive `fault=` or `fault_every`/`fault`): `http_500`, `http_503`, `reset` (close
without answering), `hang` (never answer), `cut_after:N` (close after N tokens),
`malformed_after:N` (a non-JSON data line after N tokens), `error_after:N` (an `{"error":...}`
event after N tokens). A refused connection is simply a port nobody listens on.

`close_after_stream=True` mimics llama-server: `Keep-Alive` advertised, connection closed after
every streamed response.

Scripted capacity (for the limit search): `max_streams=N` serves at most N streams at once, the
others wait their turn (as llama-server defers requests when every slot is busy), so TTFT grows
once more than N users stream; `slowdown_per_stream` stretches a stream's TTFT and gaps by that
fraction for every other stream it shares the server with; `rate_limit_rps=R` starts requests at
most R a second on average, in bursts of at most one second's worth (a token bucket), so queueing
grows without bound once arrivals come faster. `enforce_context=True` refuses a prompt of `n_ctx`
tokens or more with llama-server's HTTP 400 `exceed_context_size_error` (and its two counts) and
cuts a reply at the slot's end. Reasoning:
`reasoning_tokens=K` (or the directive `reasoning=K`) sends a stream's first K tokens as
`delta.reasoning_content`, the rest as content.

A known tail (for the verdict's error rates): `slow_frac=F` makes a share F of requests slow, each
taking `slow_ttft_ms` to its first token; `slow_burst=B` makes them come in episodes of B requests
in a row as they reach the server (a stall that hits every request in flight at once), started at
random so that the long-run share is F whatever B is (`SlowEpisodes`, which the benchmark also
drives without a server).

Tokens: a word-level vocabulary (words and punctuation marks). `/tokenize` gives their ids,
`/detokenize` turns ids back into text, `/apply-template` writes the chat prompt the fake counts
for `usage.prompt_tokens` (`[role] text` per message, then `[assistant]`), and `/props` says the
slot count and context, as llama-server's endpoints of those names do.

Run in-process with `FakeServer(script).start()` (own thread and event loop), or in a process of
its own with `FakeServerProcess(script).start()` (what calibration uses, so the server has its
own core time like a real one), i.e. `python -m quantload.load.fakeserver --port 0 --port-file F`.
"""

from __future__ import annotations

__all__ = ["FakeScript", "FakeServerProcess", "SlowEpisodes", "serve_forever"]

import argparse
import asyncio
import contextlib
import http.client
import json
import random
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from quantload.childproc import start_child, stop_group
from quantload.stats import percentile

MAX_LATENESS_SAMPLES = 500_000
DIRECTIVE = re.compile(r"\[\[fake ([^\]]*)\]\]")
TOKEN_PATTERN = re.compile(r"\w+|[^\w\s]")


@dataclass(frozen=True)
class FakeScript:
    """How the fake server answers; ranges are (low, high) in milliseconds, drawn uniformly."""

    ttft_ms: tuple[float, float] = (20.0, 200.0)
    itl_ms: tuple[float, float] = (5.0, 20.0)
    tokens: int = 16
    seed: int = 0
    pathological: bool = True
    close_after_stream: bool = False
    fault_every: int = 0
    fault: str = ""
    slots: int = 4
    slots_erasable: bool = False
    model: str = "fake-model"
    n_ctx: int = 4096
    max_streams: int = 0  # 0 = no limit
    slowdown_per_stream: float = 0.0
    rate_limit_rps: float = 0.0  # 0 = no limit
    reasoning_tokens: int = 0
    enforce_context: bool = False  # a prompt of n_ctx tokens or more is refused, as llama-server does
    slow_frac: float = 0.0  # the share of requests that are slow (a known tail)
    slow_ttft_ms: float = 1000.0  # a slow request's time to first token
    slow_burst: int = 1  # slow requests come in episodes of this many in a row


class SlowEpisodes:
    """Which requests are slow, in the order they arrive: episodes of `burst` requests in a row,
    each started with the chance that keeps the long-run share at `share` (a request outside an
    episode starts one with probability share / (burst * (1 - share)))."""

    def __init__(self, share: float, burst: int, rng: random.Random) -> None:
        if not 0.0 <= share < 1.0 or burst < 1:
            raise ValueError("a slow share in [0, 1) and episodes of at least one request")
        self.start_chance = share / (burst * (1.0 - share)) if share else 0.0
        self.burst = burst
        self.rng = rng
        self.left = 0

    def next_is_slow(self) -> bool:
        """Whether the next request is slow."""
        if self.left > 0:
            self.left -= 1
            return True
        if self.start_chance and self.rng.random() < self.start_chance:
            self.left = self.burst - 1
            return True
        return False


@dataclass
class RequestPlan:
    """The script of one request."""

    ttft_ms: float
    itl_ms: float
    tokens: int
    fault: str = ""
    reasoning: int = 0


@dataclass
class FakeStats:
    """Counters the tests and the benchmark read back (`GET /stats`)."""

    requests: int = 0
    in_flight: int = 0
    max_in_flight: int = 0
    connections: int = 0
    faults: dict[str, int] = field(default_factory=dict)
    erased: int = 0
    token_late_ms: deque[float] = field(default_factory=lambda: deque(maxlen=MAX_LATENESS_SAMPLES))

    def to_json(self) -> dict[str, Any]:
        late = list(self.token_late_ms)
        return {
            "requests": self.requests,
            "in_flight": self.in_flight,
            "max_in_flight": self.max_in_flight,
            "connections": self.connections,
            "faults": self.faults,
            "erased": self.erased,
            "token_late_ms": {
                "count": len(late),
                "p50": percentile(late, 50),
                "p99": percentile(late, 99),
                "max": max(late) if late else None,
            },
        }


def parse_directive(text: str) -> dict[str, str]:
    """`key=value` pairs of every `[[fake ...]]` directive in `text`."""
    found: dict[str, str] = {}
    for match in DIRECTIVE.finditer(text):
        for pair in match.group(1).split():
            key, sep, value = pair.partition("=")
            if sep:
                found[key] = value
    return found


def count_tokens(text: str) -> int:
    """The fake tokenizer: words and punctuation marks."""
    return len(TOKEN_PATTERN.findall(text))


def chat_prompt(messages: Any) -> str:
    """The fake chat template: `[role] text` per message, then `[assistant]`."""
    parts = []
    for message in messages if isinstance(messages, list) else []:
        if isinstance(message, dict):
            parts.append(f"[{message.get('role', 'user')}] {message.get('content') or ''}")
    return " ".join([*parts, "[assistant]"])


class Vocabulary:
    """Word-level token ids, grown as texts are tokenized."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._pieces: list[str] = []

    def tokenize(self, text: str) -> list[int]:
        ids = []
        for piece in TOKEN_PATTERN.findall(text):
            found = self._ids.get(piece)
            if found is None:
                found = self._ids[piece] = len(self._pieces)
                self._pieces.append(piece)
            ids.append(found)
        return ids

    def detokenize(self, ids: list[Any]) -> str:
        return " ".join(self._pieces[i] for i in ids if isinstance(i, int) and 0 <= i < len(self._pieces))


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(obj: Any, spaced: bool = False) -> bytes:
    text = json.dumps(obj, separators=(", ", ": ") if spaced else (",", ":"))
    return _chunk(b"data: " + text.encode() + b"\n\n")


class _Handler:
    def __init__(self, script: FakeScript, stats: FakeStats) -> None:
        self.script = script
        self.stats = stats
        self.rng = random.Random(script.seed)
        self.open_writers: set[asyncio.StreamWriter] = set()  # closed at once when the server stops
        self._base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": script.model}
        self._opening = (
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100\r\n\r\n"
        )
        if script.pathological:
            role = {"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}
            empty = {"index": 0, "delta": {"content": ""}, "finish_reason": None}
            self._opening += _event({**self._base, "choices": [role]})
            self._opening += _chunk(b": keep-alive\n\n")
            self._opening += _event({**self._base, "choices": [empty]}, spaced=True)
        self._tokens: list[bytes] = []
        self._thoughts: list[bytes] = []
        self.vocabulary = Vocabulary()
        self._next_start = 0.0
        self._streams: asyncio.Semaphore | None = None
        self.slow = SlowEpisodes(script.slow_frac, script.slow_burst, random.Random(script.seed + 1))

    def _token_event(self, index: int, reasoning: bool = False) -> bytes:
        """The (pre-serialized) chunk of token `index`; odd ones with spaced JSON."""
        cache = self._thoughts if reasoning else self._tokens
        key = "reasoning_content" if reasoning else "content"
        while len(cache) <= index:
            k = len(cache)
            text = f"{'think' if reasoning else 'tok'}{k} "
            choice = {"index": 0, "delta": {key: text}, "finish_reason": None}
            spaced = bool(k % 2) and self.script.pathological
            cache.append(_event({**self._base, "choices": [choice]}, spaced=spaced))
        return cache[index]

    def plan(self, body: dict[str, Any]) -> RequestPlan:
        text = json.dumps(body.get("messages", body.get("prompt", "")))
        directive = parse_directive(text)
        low, high = self.script.ttft_ms
        ttft = self.rng.uniform(low, high)
        low, high = self.script.itl_ms
        itl = self.rng.uniform(low, high)
        limit = body.get("max_tokens") or body.get("n_predict") or self.script.tokens
        tokens = min(int(limit), self.script.tokens)
        fault = ""
        every = self.script.fault_every
        if every and self.stats.requests % every == 0:
            fault = self.script.fault
        if self.slow.next_is_slow():
            ttft = self.script.slow_ttft_ms
        plan = RequestPlan(ttft, itl, tokens, fault, self.script.reasoning_tokens)
        if "reasoning" in directive:
            plan.reasoning = int(directive["reasoning"])
        if "ttft_ms" in directive:
            plan.ttft_ms = float(directive["ttft_ms"])
        if "itl_ms" in directive:
            plan.itl_ms = float(directive["itl_ms"])
        if "tokens" in directive:
            plan.tokens = min(int(directive["tokens"]), int(limit))
        if "fault" in directive:
            plan.fault = directive["fault"]
        return plan

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.stats.connections += 1
        self.open_writers.add(writer)
        try:
            while True:
                keep_open = await self._one(reader, writer)
                if not keep_open:
                    break
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):  # OSError: TLS too
            pass
        finally:
            self.open_writers.discard(writer)
            with contextlib.suppress(Exception):
                writer.close()

    async def abort_open(self) -> None:
        """Drop every connection still open (a TLS one's polite close needs a loop that is ending)."""
        for writer in list(self.open_writers):
            writer.transport.abort()
        await asyncio.sleep(0)  # the aborted transports close their sockets on the next turn

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except asyncio.IncompleteReadError:
            return False
        lines = head.decode("latin-1").split("\r\n")
        method, target, _version = ([*lines[0].split(" "), "", "", ""])[:3]
        headers = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0") or 0)
        raw = await reader.readexactly(length) if length else b""
        received = asyncio.get_running_loop().time()
        path, _, query = target.partition("?")
        if method == "GET" and path in ("/health", "/v1/health"):
            return await self._json(writer, 200, {"status": "ok"})
        if method == "GET" and path == "/stats":
            answer = self.stats.to_json()
            if "reset=1" in query.split("&"):
                self.stats.token_late_ms.clear()
            return await self._json(writer, 200, answer)
        if method == "GET" and path == "/script":
            return await self._json(writer, 200, asdict(self.script))
        if method == "GET" and path == "/slots":
            slots = [{"id": i, "n_ctx": 4096, "is_processing": False} for i in range(self.script.slots)]
            return await self._json(writer, 200, slots)
        if method == "POST" and path.startswith("/slots/"):
            if not self.script.slots_erasable:
                return await self._json(writer, 501, _error(501, "slot actions not supported"))
            self.stats.erased += 1
            return await self._json(writer, 200, {"id_slot": path.rsplit("/", 1)[-1], "n_erased": 0})
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return await self._json(writer, 400, _error(400, "body is not JSON"))
        if method == "POST" and path == "/tokenize":
            content = str(body.get("content", ""))
            return await self._json(writer, 200, {"tokens": self.vocabulary.tokenize(content)})
        if method == "POST" and path == "/detokenize":
            tokens = body.get("tokens")
            text = self.vocabulary.detokenize(tokens if isinstance(tokens, list) else [])
            return await self._json(writer, 200, {"content": text})
        if method == "POST" and path == "/apply-template":
            return await self._json(writer, 200, {"prompt": chat_prompt(body.get("messages"))})
        if method == "GET" and path == "/props":
            props = {
                "total_slots": self.script.slots,
                "default_generation_settings": {"n_ctx": self.script.n_ctx},
                "model_alias": self.script.model,
            }
            return await self._json(writer, 200, props)
        if method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            del query
            return await self._chat(reader, writer, body, received)
        return await self._json(writer, 404, _error(404, f"no route {method} {path}"))

    async def _json(self, writer: asyncio.StreamWriter, status: int, obj: Any) -> bool:
        data = json.dumps(obj).encode()
        reason = {
            200: "OK",
            400: "Bad Request",
            404: "Not Found",
            500: "Internal Server Error",
            501: "Not Implemented",
            503: "Service Unavailable",
        }.get(status, "Error")
        writer.write(
            b"HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
            b"Keep-Alive: timeout=5, max=100\r\n\r\n%s" % (status, reason.encode(), len(data), data)
        )
        await writer.drain()
        return True

    async def _chat(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        body: dict[str, Any],
        received: float,
    ) -> bool:
        stats = self.stats
        plan = self.plan(body)
        stats.requests += 1
        if plan.fault:
            key = plan.fault.split(":")[0]
            stats.faults[key] = stats.faults.get(key, 0) + 1
        if plan.fault in ("http_500", "http_503"):
            code = 500 if plan.fault == "http_500" else 503
            return await self._json(writer, code, _error(code, "scripted failure"))
        if plan.fault == "reset":
            return False
        if self.script.enforce_context:
            prompt_tokens = count_tokens(chat_prompt(body.get("messages")))
            if prompt_tokens >= self.script.n_ctx:
                return await self._json(writer, 400, _exceeded(prompt_tokens, self.script.n_ctx))
            plan.tokens = min(plan.tokens, self.script.n_ctx - prompt_tokens)  # the slot fills: truncated
        received = await self._admit(received)
        stats.in_flight += 1
        stats.max_in_flight = max(stats.max_in_flight, stats.in_flight)
        if self.script.slowdown_per_stream:
            stretch = 1.0 + self.script.slowdown_per_stream * (stats.in_flight - 1)
            plan.ttft_ms, plan.itl_ms = plan.ttft_ms * stretch, plan.itl_ms * stretch
        try:
            if plan.fault == "hang":
                # never answer; leave when the client gives up and closes
                while await reader.read(65536):
                    pass
                return False
            if not body.get("stream"):
                return await self._non_stream(writer, body, plan, received)
            return await self._stream(writer, body, plan, received)
        finally:
            stats.in_flight -= 1
            if self._streams is not None:
                self._streams.release()

    async def _admit(self, received: float) -> float:
        """Wait for the scripted capacity (rate limit, then a free stream); when the stream starts."""
        loop = asyncio.get_running_loop()
        rate = self.script.rate_limit_rps
        if rate > 0:  # a token bucket holding one second's worth (GCRA: theoretical arrival times)
            interval, now = 1.0 / rate, loop.time()
            due = max(self._next_start, now)
            start = max(now, due - (max(round(rate), 1) - 1) * interval)
            self._next_start = due + interval
            await _sleep_until(start)
        if self.script.max_streams > 0:
            if self._streams is None:
                self._streams = asyncio.Semaphore(self.script.max_streams)
            await self._streams.acquire()
        return loop.time() if (rate > 0 or self.script.max_streams > 0) else received

    async def _non_stream(
        self, writer: asyncio.StreamWriter, body: dict[str, Any], plan: RequestPlan, received: float
    ) -> bool:
        await _sleep_until(received + (plan.ttft_ms + plan.itl_ms * max(plan.tokens - 1, 0)) / 1000)
        prompt_tokens = count_tokens(chat_prompt(body.get("messages")))
        reply = {
            "object": "chat.completion",
            "model": self.script.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "tok " * plan.tokens},
                    "finish_reason": "length",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": plan.tokens,
                "total_tokens": prompt_tokens + plan.tokens,
            },
        }
        return await self._json(writer, 200, reply)

    async def _stream(
        self, writer: asyncio.StreamWriter, body: dict[str, Any], plan: RequestPlan, received: float
    ) -> bool:
        """Stream the scripted tokens; each write is a timer callback at its due time.

        Timer callbacks instead of a coroutine sleeping per token keep the server cheap enough
        to script hundreds of streams on a small machine (one timer handle per token, no task
        switch), so the benchmark measures the client rather than the fake server.
        """
        loop = asyncio.get_running_loop()
        close = self.script.close_after_stream
        writer.write(self._opening)
        kind, _, arg = plan.fault.partition(":")
        fault_at = int(arg) if arg else -1
        first_at = received + plan.ttft_ms / 1000
        received_unix_s = time.time() - (loop.time() - received)
        done: asyncio.Future[bool] = loop.create_future()
        handles: list[asyncio.TimerHandle] = []
        late_ms = [0.0]
        token_late = self.stats.token_late_ms

        def finish(keep_open: bool) -> None:
            for handle in handles:
                handle.cancel()
            if not done.done():
                done.set_result(keep_open)

        def emit(index: int) -> None:
            if done.done():
                return
            if writer.transport.is_closing():
                finish(False)
                return
            if index == fault_at:
                if kind == "cut_after":
                    writer.transport.abort()
                    finish(False)
                    return
                if kind == "malformed_after":
                    writer.write(_chunk(b'data: {"choices": [{"delta": {"content": "x"\n\n'))
                    finish(False)
                    return
                if kind == "error_after":
                    writer.write(_event({"error": {"code": 500, "message": "scripted error event"}}))
                    writer.write(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
                    finish(not close)
                    return
            late = (loop.time() - first_at) * 1000 - index * plan.itl_ms
            if index == 0:
                late_ms[0] = late
            token_late.append(late)
            thinking = index < plan.reasoning
            writer.write(self._token_event(index - (0 if thinking else plan.reasoning), thinking))
            if index == plan.tokens - 1:
                writer.write(self._tail(body, plan, late_ms[0], received_unix_s))
                finish(not close)

        if plan.tokens == 0:
            writer.write(self._tail(body, plan, 0.0, received_unix_s))
            finish(not close)
        for index in range(plan.tokens):
            handles.append(loop.call_at(first_at + index * plan.itl_ms / 1000, emit, index))
        keep_open = await done
        await writer.drain()
        return keep_open

    def _tail(self, body: dict[str, Any], plan: RequestPlan, late_ms: float, received_unix_s: float) -> bytes:
        """The finish chunk, the usage+timings chunk, [DONE] and the end of the body."""
        base = self._base
        prompt_tokens = count_tokens(chat_prompt(body.get("messages")))
        timings = {
            "cache_n": 0,
            "prompt_n": prompt_tokens,
            "prompt_ms": plan.ttft_ms,
            "predicted_n": plan.tokens,
            "predicted_ms": plan.itl_ms * max(plan.tokens - 1, 0),
            "predicted_per_token_ms": plan.itl_ms,
            "first_token_late_ms": late_ms,
            "request_received_unix_s": received_unix_s,
        }
        usage = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": plan.tokens,
            "total_tokens": prompt_tokens + plan.tokens,
            "prompt_tokens_details": {"cached_tokens": 0},
        }
        tail = _event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]})
        tail += _event({**base, "choices": [], "usage": usage, "timings": timings})
        return tail + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"


def _error(code: int, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "type": "fake_error"}}


def _exceeded(prompt_tokens: int, n_ctx: int) -> dict[str, Any]:
    """llama-server's refusal of a prompt that does not fit the slot, with its two counts."""
    message = f"request ({prompt_tokens} tokens) exceeds the available context size ({n_ctx} tokens)"
    error = {"code": 400, "message": message, "type": "exceed_context_size_error"}
    return {"error": {**error, "n_prompt_tokens": prompt_tokens, "n_ctx": n_ctx}}


async def _sleep_until(when: float) -> None:
    delay = when - asyncio.get_running_loop().time()
    if delay > 0:
        await asyncio.sleep(delay)


class FakeServer:
    """The fake server on its own thread and event loop; `with FakeServer(...) as server:`."""

    def __init__(
        self,
        script: FakeScript | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self.script = script or FakeScript()
        self.host = host
        self.port = port
        self.ssl_context = ssl_context  # serve HTTPS with this server-side context
        self.stats = FakeStats()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://{self.host}:{self.port}"

    def start(self) -> FakeServer:
        """Start serving; returns once the port is bound."""
        self._thread = threading.Thread(target=self._run, name="fake-openai-server", daemon=True)
        self._thread.start()
        self._ready.wait(10)
        if self._error is not None:
            raise self._error
        return self

    def _run(self) -> None:
        try:
            asyncio.run(self._main())
        except BaseException as error:
            self._error = error
            self._ready.set()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        handler = _Handler(self.script, self.stats)
        server = await asyncio.start_server(
            handler.serve, self.host, self.port, limit=1 << 22, ssl=self.ssl_context
        )
        self.port = server.sockets[0].getsockname()[1]
        self._ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            await handler.abort_open()

    def stop(self) -> None:
        """Stop serving and join the thread."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> FakeServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def serve_forever(
    script: FakeScript,
    host: str,
    port: int,
    port_file: Path | None,
    on_ready: Callable[[int], None] | None = None,
) -> None:
    """Serve in this process until interrupted; write the bound port to `port_file` and give it
    to `on_ready`."""

    async def main() -> None:
        handler = _Handler(script, FakeStats())
        server = await asyncio.start_server(handler.serve, host, port, limit=1 << 22, backlog=1024)
        bound = server.sockets[0].getsockname()[1]
        if port_file is not None:
            partial = port_file.with_suffix(".partial")
            partial.write_text(str(bound))
            partial.replace(port_file)
        if on_ready is not None:
            on_ready(bound)
        async with server:
            await server.serve_forever()

    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main())


class FakeServerProcess:
    """The fake server in a process of its own on loopback; `with FakeServerProcess(script) as f:`.

    Its own process gives it its own core time, as a real server has, so what a client measures
    against it is the client's doing, not a shared interpreter's.
    """

    def __init__(self, script: FakeScript, host: str = "127.0.0.1", start_timeout_s: float = 20.0) -> None:
        self.script = script
        self.host = host
        self.start_timeout_s = start_timeout_s
        self.port = 0
        self._process: subprocess.Popen[bytes] | None = None
        self._folder: tempfile.TemporaryDirectory[str] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The fake's process id while it runs."""
        return self._process.pid if self._process is not None else None

    def command(self, port_file: Path) -> list[str]:
        """The command line that serves `script` and writes the bound port to `port_file`."""
        script = self.script
        argv = [
            sys.executable, "-m", "quantload.load.fakeserver", "--host", self.host, "--port", "0",
            "--port-file", str(port_file),
            "--ttft-ms", f"{script.ttft_ms[0]!r},{script.ttft_ms[1]!r}",
            "--itl-ms", f"{script.itl_ms[0]!r},{script.itl_ms[1]!r}",
            "--tokens", str(script.tokens), "--seed", str(script.seed),
        ]  # fmt: skip
        if not script.pathological:
            argv.append("--plain")
        if script.close_after_stream:
            argv.append("--close-after-stream")
        if script.fault_every:
            argv += ["--fault-every", str(script.fault_every), "--fault", script.fault]
        if script.max_streams:
            argv += ["--max-streams", str(script.max_streams)]
        if script.slowdown_per_stream:
            argv += ["--slowdown-per-stream", repr(script.slowdown_per_stream)]
        if script.rate_limit_rps:
            argv += ["--rate-limit-rps", repr(script.rate_limit_rps)]
        if script.reasoning_tokens:
            argv += ["--reasoning-tokens", str(script.reasoning_tokens)]
        if script.slow_frac:
            argv += [
                "--slow-frac", repr(script.slow_frac), "--slow-ttft-ms", repr(script.slow_ttft_ms),
                "--slow-burst", str(script.slow_burst),
            ]  # fmt: skip
        return argv

    def start(self) -> FakeServerProcess:
        """Start the process; returns once it listens. RuntimeError if it does not start."""
        self._folder = tempfile.TemporaryDirectory(prefix="quantload-fake-")
        port_file = Path(self._folder.name) / "port"
        self._process = start_child(
            self.command(port_file), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        deadline = time.monotonic() + self.start_timeout_s
        while not port_file.exists():
            if time.monotonic() > deadline or self._process.poll() is not None:
                self.stop()
                raise RuntimeError("the fake server process did not start")
            time.sleep(0.02)
        self.port = int(port_file.read_text().strip())
        return self

    def stats(self, reset: bool = False) -> dict[str, Any]:
        """The server's counters (`GET /stats`); `reset` starts a new token-lateness window."""
        connection = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            connection.request("GET", "/stats?reset=1" if reset else "/stats")
            answer: dict[str, Any] = json.loads(connection.getresponse().read())
        finally:
            connection.close()
        return answer

    def stop(self) -> None:
        """Stop the process (SIGTERM, then SIGKILL) and remove its folder."""
        process, self._process = self._process, None
        if process is not None:
            stop_group(process)
        if self._folder is not None:
            self._folder.cleanup()
            self._folder = None

    def __enter__(self) -> FakeServerProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _range(text: str) -> tuple[float, float]:
    low, _, high = text.partition(",")
    return float(low), float(high or low)


def main(argv: list[str] | None = None) -> int:
    """Command line of the fake server process."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--port-file", type=Path)
    parser.add_argument("--ttft-ms", type=_range, default=(20.0, 200.0), help="LOW,HIGH")
    parser.add_argument("--itl-ms", type=_range, default=(5.0, 20.0), help="LOW,HIGH")
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--plain", action="store_true", help="no pathological chunks")
    parser.add_argument("--close-after-stream", action="store_true")
    parser.add_argument("--fault-every", type=int, default=0)
    parser.add_argument("--fault", default="")
    parser.add_argument("--max-streams", type=int, default=0, help="streams served at once (0: any)")
    parser.add_argument("--slowdown-per-stream", type=float, default=0.0)
    parser.add_argument("--rate-limit-rps", type=float, default=0.0, help="requests started per s")
    parser.add_argument("--reasoning-tokens", type=int, default=0)
    parser.add_argument("--slow-frac", type=float, default=0.0, help="share of slow requests")
    parser.add_argument("--slow-ttft-ms", type=float, default=1000.0, help="a slow request's TTFT")
    parser.add_argument("--slow-burst", type=int, default=1, help="slow requests in a row")
    args = parser.parse_args(argv)
    script = replace(
        FakeScript(),
        ttft_ms=args.ttft_ms,
        itl_ms=args.itl_ms,
        tokens=args.tokens,
        seed=args.seed,
        pathological=not args.plain,
        close_after_stream=args.close_after_stream,
        fault_every=args.fault_every,
        fault=args.fault,
        max_streams=args.max_streams,
        slowdown_per_stream=args.slowdown_per_stream,
        rate_limit_rps=args.rate_limit_rps,
        reasoning_tokens=args.reasoning_tokens,
        slow_frac=args.slow_frac,
        slow_ttft_ms=args.slow_ttft_ms,
        slow_burst=args.slow_burst,
    )
    serve_forever(script, args.host, args.port, args.port_file)
    return 0


if __name__ == "__main__":
    sys.exit(main())
