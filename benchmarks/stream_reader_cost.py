"""CPU cost of reading one streamed answer: framing + SSE while it arrives, then the chunk layer.

Builds the answer the fake server sends (chunked, one event per chunk: the role-only chunk, a
keep-alive comment, an empty delta, TOKENS content chunks alternating compact and spaced JSON,
the finish, usage and [DONE] chunks) and times (CPU time, best of several rounds):
  per-read   `EventStreamParser.feed` once per chunk, as the client reads a live stream;
  one-read   the whole answer in one `feed` (a client that fell behind);
  classify   `classify_stream` on the stamped payloads (off the users' path, in the recorder).
Run it against another checkout's code with PYTHONPATH=<that checkout>/src to compare.

    .venv/bin/python benchmarks/stream_reader_cost.py
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from quantload.load.openai_chunks import classify_stream
from quantload.load.sse import EventStreamParser
from quantload.load.stream_result import StreamResult

TOKENS = 16
STREAMS = 2000
ROUNDS = 15


def _chunk(event: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(event), event)


def _event(obj: Any, spaced: bool = False) -> bytes:
    text = json.dumps(obj, separators=(", ", ": ") if spaced else (",", ":"))
    return _chunk(b"data: " + text.encode() + b"\n\n")


def answer_pieces() -> list[bytes]:
    """The answer as the reads that would deliver it: the head with the first chunk, then one
    chunk per read."""
    base = {"id": "chatcmpl-fake", "object": "chat.completion.chunk", "model": "fake-model"}
    head = (
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        b"Transfer-Encoding: chunked\r\nKeep-Alive: timeout=5, max=100\r\n\r\n"
    )
    role = {"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}
    pieces = [head + _event({**base, "choices": [role]}), _chunk(b": keep-alive\n\n")]
    pieces.append(_event({**base, "choices": [{"index": 0, "delta": {"content": ""}}]}, spaced=True))
    for k in range(TOKENS):
        choice = {"index": 0, "delta": {"content": f"tok{k} "}, "finish_reason": None}
        pieces.append(_event({**base, "choices": [choice]}, spaced=bool(k % 2)))
    pieces.append(_event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]}))
    usage = {"prompt_tokens": 9, "completion_tokens": TOKENS, "total_tokens": 9 + TOKENS}
    timings = {"prompt_n": 9, "prompt_ms": 20.0, "predicted_n": TOKENS, "predicted_ms": 75.0}
    pieces.append(_event({**base, "choices": [], "usage": usage, "timings": timings}))
    pieces.append(_chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n")
    return pieces


def _best_us(run: Any) -> float:
    """CPU time (not wall time: a shared machine's waits for a core do not count), best round."""
    best = float("inf")
    for _ in range(ROUNDS):
        started = time.process_time()
        run()
        best = min(best, time.process_time() - started)
    return best / STREAMS * 1e6


def main() -> int:
    pieces = answer_pieces()
    whole = b"".join(pieces)
    payloads = EventStreamParser().feed(whole)
    assert len(payloads) == TOKENS + 5, len(payloads)

    def per_read() -> None:
        for _ in range(STREAMS):
            parser = EventStreamParser()
            for piece in pieces:
                parser.feed(piece)
            assert parser.complete

    def one_read() -> None:
        for _ in range(STREAMS):
            EventStreamParser().feed(whole)

    def classify() -> None:
        for _ in range(STREAMS):
            result = StreamResult(events=[(0.001 * i, p) for i, p in enumerate(payloads)])
            classify_stream(result)
            assert result.ok

    print(f"{TOKENS}-token stream, {len(pieces)} reads, best of {ROUNDS} x {STREAMS} streams:")
    print(f"  per-read framing+SSE  {_best_us(per_read):7.1f} us/stream")
    print(f"  one-read framing+SSE  {_best_us(one_read):7.1f} us/stream")
    print(f"  classify_stream       {_best_us(classify):7.1f} us/stream")
    return 0


if __name__ == "__main__":
    sys.exit(main())
