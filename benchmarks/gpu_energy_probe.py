"""Energy per output token through the exporter's NVML series, against a running llama-server.

Scrapes the exporter's /metrics, sends a bounded number of chat completions to the server (a few
at a time), scrapes again, and prints every quantload_gpu_* series of the last scrape, each GPU's
energy used in between (the counter's difference), the output tokens the server reported
(`usage.completion_tokens`) and the joules per output token and per request. Run by
benchmarks/gpu_telemetry_check.sh on a machine with an NVIDIA GPU; exits 1 when the exporter
serves no GPU series.

    .venv/bin/python benchmarks/gpu_energy_probe.py --server http://127.0.0.1:8080 \
        --exporter http://127.0.0.1:9646 [--requests 64] [--concurrency 4] [--max-tokens 128]
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
from prometheus_client.parser import text_string_to_metric_families

from quantload.exporter import names

REQUEST_TIMEOUT_S = 120.0
PROMPT = "Write a short paragraph about the sea."


def _gpu_samples(exporter: str) -> dict[tuple[str, str], float]:
    """{(sample name, gpu index): value} of the quantload_gpu_* series in one scrape."""
    text = httpx.get(f"{exporter}/metrics", timeout=10).text
    return {
        (sample.name, sample.labels.get("gpu", "")): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name.startswith(names.GPU_PREFIX)
    }


def _one_request(client: httpx.Client, server: str, max_tokens: int) -> int:
    response = client.post(
        f"{server}/v1/chat/completions",
        json={
            "messages": [{"role": "user", "content": PROMPT}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": False,
        },
        timeout=REQUEST_TIMEOUT_S,
    )
    response.raise_for_status()
    return int(response.json()["usage"]["completion_tokens"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--server", required=True)
    parser.add_argument("--exporter", required=True)
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=128)
    args = parser.parse_args()

    before, before_s = _gpu_samples(args.exporter), time.monotonic()
    if not before:
        print("no quantload_gpu_* series: the exporter found no NVML or no GPU (see its log line)")
        return 1
    with httpx.Client() as client, ThreadPoolExecutor(args.concurrency) as pool:
        sent = [pool.submit(_one_request, client, args.server, args.max_tokens) for _ in range(args.requests)]
        tokens = [future.result() for future in sent]
    after, elapsed_s = _gpu_samples(args.exporter), time.monotonic() - before_s  # the span between scrapes

    print("GPU series of the last scrape:")
    for (name, gpu), value in sorted(after.items()):
        print(f"  {name}{{gpu=\"{gpu}\"}} {value:g}")
    energy = names.GPU_ENERGY.name
    used = {gpu: after[(name, gpu)] - before[(name, gpu)] for (name, gpu) in after if name == energy}
    if not used:
        print("the GPUs report no energy counter (NVML total energy consumption not supported)")
        return 1
    total_j, output_tokens = sum(used.values()), sum(tokens)
    for gpu, joules in sorted(used.items()):
        print(f"GPU {gpu}: {joules:.1f} J in {elapsed_s:.1f} s")
    print(f"requests {len(tokens)}, output tokens {output_tokens}, {elapsed_s:.1f} s between the two scrapes")
    print(f"energy {total_j:.1f} J, mean power {total_j / elapsed_s:.1f} W")
    print(f"energy per output token {total_j / max(output_tokens, 1):.4f} J")
    print(f"energy per request {total_j / max(len(tokens), 1):.2f} J")
    return 0


if __name__ == "__main__":
    sys.exit(main())
