"""The floor: the leanest streaming client we could write (raw asyncio sockets, byte scans).

It shows what this machine allows when client and server share its cores. N streams (one
keep-alive connection each) send K requests in all to the fake server, closed loop, no wait;
each stream's first request waits a random offset (same as quantload's) so streams do not start
in lockstep. A request's time to first token is the first read that contains a non-empty
`content`; every content found in a read is stamped with that read's time, and the gaps between
consecutive stamps are the inter-token gaps (as quantload's client does). The scripted values are
parsed from the final chunk after the timing is done.

    .venv/bin/python benchmarks/floor_client.py --url http://127.0.0.1:PORT --streams 8 \
        --requests 300 --out floor.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

CONTENT = re.compile(rb'"content"\s*:\s*"[^"]')
TIMINGS = re.compile(rb'data: (\{[^\n]*"timings"[^\n]*\})\n')


def request_bytes(host: str, port: int, max_tokens: int, index: int) -> bytes:
    body = json.dumps(
        {
            "model": "floor",
            "messages": [{"role": "user", "content": f"floor request {index}"}],
            "stream": True,
            "stream_options": {"include_usage": True},
            "max_tokens": max_tokens,
        }
    ).encode()
    head = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def one_stream(
    host: str, port: int, counter: list[int], total: int, max_tokens: int, jitter_s: float,
    rng: random.Random, out: list[dict[str, object]],
) -> None:  # fmt: skip
    reader, writer = await asyncio.open_connection(host, port)
    first = True
    while counter[0] < total:
        index = counter[0]
        counter[0] += 1
        request = request_bytes(host, port, max_tokens, index)
        if first:
            first = False
            await asyncio.sleep(rng.uniform(0, jitter_s))
        sent = time.perf_counter()
        sent_unix = time.time()
        writer.write(request)
        content_times: list[float] = []
        raw = bytearray()
        while not raw.endswith(b"\r\n0\r\n\r\n"):  # the last chunk (not `max=100` in the head)
            data = await reader.read(65536)
            now = time.perf_counter()
            if not data:
                break
            content_times += [now - sent] * len(CONTENT.findall(data))
            raw += data
        end = time.perf_counter() - sent
        match = TIMINGS.search(bytes(raw))
        timings = json.loads(match.group(1))["timings"] if match else {}
        out.append(
            {
                "sent_unix_s": sent_unix,
                "ttft_s": content_times[0] if content_times else None,
                "content_times_s": content_times,
                "e2e_s": end,
                "timings": timings,
            }
        )
    writer.close()


async def run(
    url: str, streams: int, requests: int, max_tokens: int, jitter_s: float, seed: int
) -> dict[str, object]:
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    counter = [0]
    out: list[dict[str, object]] = []
    rng = random.Random(seed)
    cpu, wall = time.process_time(), time.perf_counter()
    await asyncio.gather(
        *(one_stream(host, port, counter, requests, max_tokens, jitter_s, rng, out) for _ in range(streams))
    )
    return {
        "records": out,
        "cpu_s": time.process_time() - cpu,
        "wall_s": time.perf_counter() - wall,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="raw-asyncio floor client")
    parser.add_argument("--url", required=True)
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--requests", type=int, default=300)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--jitter-s", type=float, default=0.0)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    result = asyncio.run(
        run(args.url, args.streams, args.requests, args.max_tokens, args.jitter_s, args.seed)
    )
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
