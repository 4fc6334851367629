"""The fake server's scripted capacity (what the limit-search tests search against), its reasoning
chunks and its tokenizer endpoints."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable

import httpx

from quantload.load.client import ConnectionPool, Endpoint, stream_request
from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.load.openai_chunks import answer_text
from quantload.load.stream_result import StreamResult


def _request(url: str, tokens: int = 4) -> Callable[[], StreamResult]:
    endpoint = Endpoint.from_url(url)
    pool = ConnectionPool(endpoint, reuse="never")
    body = json.dumps({"messages": [{"role": "user", "content": "hi"}], "stream": True, "max_tokens": tokens})
    return lambda: stream_request(pool, endpoint.request_bytes(body.encode()), 10.0)


def _at_once(send: Callable[[], StreamResult], count: int) -> list[StreamResult]:
    results: list[StreamResult] = []
    lock = threading.Lock()

    def one() -> None:
        result = send()
        with lock:
            results.append(result)

    threads = [threading.Thread(target=one) for _ in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    return results


def test_streams_beyond_the_capacity_wait_their_turn() -> None:
    script = FakeScript(ttft_ms=(30.0, 30.0), itl_ms=(30.0, 30.0), tokens=4, max_streams=2, pathological=False)
    with FakeServer(script) as server:
        results = _at_once(_request(server.url), 4)
        assert server.stats.max_in_flight == 2
    ttfts = sorted(r.ttft_s or 0.0 for r in results)
    assert all(r.ok for r in results)
    # two start at once (30 ms); two wait for a whole stream (30 + 3 x 30 ms) before their own 30 ms
    assert ttfts[1] < 0.1 and ttfts[2] > 0.12


def test_a_rate_limit_lets_one_seconds_worth_through_then_spaces_starts() -> None:
    script = FakeScript(ttft_ms=(5.0, 5.0), itl_ms=(1.0, 1.0), tokens=2, rate_limit_rps=4.0, pathological=False)
    with FakeServer(script) as server:
        results = _at_once(_request(server.url, 2), 6)
    ttfts = sorted(r.ttft_s or 0.0 for r in results)
    assert ttfts[3] < 0.15  # a burst of 4 (one second's worth) starts at once
    assert 0.2 < ttfts[4] < 0.4 and ttfts[5] > 0.45  # then one every 250 ms


def test_slowdown_stretches_shared_streams() -> None:
    script = FakeScript(ttft_ms=(40.0, 40.0), itl_ms=(1.0, 1.0), tokens=2, slowdown_per_stream=1.0, pathological=False)
    with FakeServer(script) as server:
        alone_s = min(_request(server.url, 2)().ttft_s or 0.0 for _ in range(3))
        together = _at_once(_request(server.url, 2), 3)
    slowest_together_s = max(r.ttft_s or 0.0 for r in together)
    # scripted: 40 ms alone, x3 for the third of three (120 ms); a busy machine only adds to both,
    # so the gap is judged against the best of three lone requests
    assert alone_s >= 0.04 and slowest_together_s > 0.1
    assert slowest_together_s - alone_s > 0.05


def test_reasoning_tokens_come_first_as_reasoning_content() -> None:
    script = FakeScript(ttft_ms=(5.0, 5.0), itl_ms=(2.0, 2.0), tokens=5, reasoning_tokens=3)
    with FakeServer(script) as server:
        result = stream_request(
            ConnectionPool(Endpoint.from_url(server.url)),
            Endpoint.from_url(server.url).request_bytes(b'{"messages": [], "stream": true}'),
            10.0,
            classify=False,
        )
        payloads = [payload for _, payload in result.events]
    assert answer_text(payloads) == "tok0 tok1 "
    assert sum(b"reasoning_content" in p for p in payloads) == 3


def test_tokenize_detokenize_and_the_chat_template_agree() -> None:
    with FakeServer(FakeScript(slots=3, n_ctx=1024)) as server, httpx.Client(base_url=server.url) as client:
        ids = client.post("/tokenize", json={"content": "Hello, world again!"}).json()["tokens"]
        assert len(ids) == 5
        text = client.post("/detokenize", json={"tokens": ids}).json()["content"]
        assert client.post("/tokenize", json={"content": text}).json()["tokens"] == ids
        prompt = client.post("/apply-template", json={"messages": [{"role": "user", "content": "x"}]}).json()
        assert prompt == {"prompt": "[user] x [assistant]"}
        props = client.get("/props").json()
        assert props["total_slots"] == 3 and props["default_generation_settings"]["n_ctx"] == 1024
