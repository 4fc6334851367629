"""The load client's memory does not grow with a soak's length: a long-ish soak against the fake
server (in a process of its own: the real Locust process, the real supervisor), bounded.

The bound: the load process's resident memory may grow at most GROWTH_BOUND_BYTES (2 MiB) from
the median of slices 6-10 (after its first ~8 s: imports done, pools and caches warm, allocator
arenas in use) to the median of the last five, while at least MIN_REQUESTS_BETWEEN requests are
sent in between (or 100 bytes a request, where more requests were sent: a quiet machine sends
over 50,000).
Why that bound: it is under 420 bytes a request at that count, so it catches anything kept per
request (a record is over 1.5 kB as a JSON line and several kB as objects; a ticket with its
messages, a stream result with its chunk times, an inter-token gap list each more than that), and
under 85 kB a slice over the 25 slices between, so it catches anything kept per slice (a stage's
figures, its health windows, its tickets); and it is above the allocator's own steps (pymalloc
takes memory in 1 MiB arenas, and the medians smooth single steps), so it holds on a busy machine. What it cannot see
in a minute is Locust's own per-second counters (about 1 MiB an hour, reset with every slice:
tests/unit/load/test_soak.py holds the reset) — benchmarks/soak_figures.py measures the hour.
"""

from __future__ import annotations

import statistics
from pathlib import Path

import pytest

from load_api import context
from quantload.config import LoadSettings
from quantload.experiments.base import ExperimentContext
from quantload.experiments.soak.stages import run as run_soak
from quantload.load.fakeserver import FakeScript, FakeServerProcess
from quantload.served import ServedTarget

pytestmark = pytest.mark.integration

GROWTH_BOUND_BYTES = 2 * 2**20
MIN_REQUESTS_BETWEEN = 5_000
PER_REQUEST_BOUND_BYTES = 100  # over 52,672 requests on a quiet machine it grew 62 bytes a request


@pytest.mark.slow
@pytest.mark.long  # tens of thousands of requests for a minute and more: `make test-long`
@pytest.mark.timeout(300)
def test_the_load_clients_memory_stays_flat_over_a_long_soak(tmp_path: Path) -> None:
    script = FakeScript(ttft_ms=(1, 2), itl_ms=(0.5, 1), tokens=8, close_after_stream=True)
    load = LoadSettings(warmup_requests=1, request_timeout_s=10, first_round_jitter_s=0.01, metrics_port=0,
                        prompt_count=32, max_tokens=8)  # fmt: skip
    run = context(tmp_path, load, soak={"duration_s": 60, "slice_s": 1.5, "users": 16, "sample_s": 5})
    with FakeServerProcess(script) as fake:
        target = ServedTarget(name="fake", quant="Q4_K_M", model="m", url=fake.url)
        done = run_soak(ExperimentContext(run, target, None))
    slices = done.summaries
    assert len(slices) == 40 and all(s.status == "ok" for s in slices)
    rss = [s.client_rss_bytes for s in slices]
    assert all(value is not None for value in rss)
    early = statistics.median(v for v in rss[5:10] if v is not None)
    late = statistics.median(v for v in rss[-5:] if v is not None)
    between = sum(s.requests for s in slices[10:-5])
    print(f"load client {early / 2**20:.2f} -> {late / 2**20:.2f} MiB over {between} requests")
    assert between >= MIN_REQUESTS_BETWEEN, f"only {between} requests: the bound says little"
    # a quiet machine sends ten times the requests of a busy one in the same minute: the bound
    # grows with them at PER_REQUEST_BOUND_BYTES, far under what keeping anything per request costs
    bound = max(GROWTH_BOUND_BYTES, PER_REQUEST_BOUND_BYTES * between)
    assert late - early <= bound, (
        f"the load process grew {(late - early) / 2**20:.2f} MiB over {between} requests"
        f" ({early / 2**20:.1f} -> {late / 2**20:.1f} MiB)"
    )
