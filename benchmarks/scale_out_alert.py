"""The scale-out alerts on a llama-server pushed past its limit: more users than it has slots.

Starts one llama-server (a prepared GGUF; 2 slots by default), the exporter and Prometheus (with
prometheus/rules/quantload.alerts.yml loaded, as `quantload run` does), then drives it with the
real load generator: one user for a while (below the limit), then `--users` users (past it) for
`--past-s` seconds. Every few seconds it prints what Prometheus sees: requests deferred, the share
of busy slots, TTFT p99, and the state of each alert (pending, firing), so the table shows when
each signal rose and when each alert fired.

    .venv/bin/python benchmarks/scale_out_alert.py MODEL.gguf [--slots 2] [--users 6] [--past-s 100]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

from quantload.config import LoadSettings, Settings, ToolchainSettings
from quantload.experiments.registry import run_experiment
from quantload.exporter import ExporterTarget, start_exporter
from quantload.llamacpp.server import LlamaServer, ServerSpec, free_port
from quantload.llamacpp.toolchain import ensure_toolchain
from quantload.observe.prometheus import PrometheusProcess
from quantload.run_context import RunContext
from quantload.rundir.handle import RunDir
from quantload.served import ServedTarget

ALERTS = ("LlamaServerQueueing", "LlamaServerSlotsSaturated", "LlamaServerTTFTOverSLO")
QUERIES = {
    "deferred": "max(quant:llamacpp_requests_deferred:sum)",
    "busy": "max(quant:quantload_server_slots_busy:ratio)",
    "ttft_p99_s": "max(quant:quantload_ttft_seconds:p99_30s)",
}


def _value(client: httpx.Client, url: str, query: str) -> str:
    result = client.get(f"{url}/api/v1/query", params={"query": query}).json()["data"]["result"]
    return f"{float(result[0]['value'][1]):.2f}" if result else "-"


def _alert_states(client: httpx.Client, url: str) -> dict[str, str]:
    result = client.get(f"{url}/api/v1/query", params={"query": "ALERTS"}).json()["data"]["result"]
    states = {name: "-" for name in ALERTS}
    for series in result:
        name = series["metric"]["alertname"]
        if name in states and states[name] != "firing":
            states[name] = series["metric"]["alertstate"]
    return states


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--slots", type=int, default=2)
    parser.add_argument("--users", type=int, default=6)
    parser.add_argument("--below-s", type=float, default=20.0)
    parser.add_argument("--past-s", type=float, default=100.0)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--every-s", type=float, default=5.0)
    args = parser.parse_args()
    toolchain = ensure_toolchain(ToolchainSettings(), {})
    folder = Path(tempfile.mkdtemp(prefix="scale-out-"))
    spec = ServerSpec(model_path=args.model, alias=args.model.stem, slots=args.slots, ctx_per_slot=2048)
    loadgen_port = free_port()
    print(f"server: {args.model.name}, {args.slots} slots; load: 1 user for {args.below_s:g} s, then"
          f" {args.users} users for {args.past_s:g} s; run folder {folder}")
    with LlamaServer(toolchain, spec, folder / "logs" / "llama-server.log") as server:
        target = ExporterTarget(name="llama-pushed", url=server.url, quant="pushed", model=args.model.stem)
        exporter = start_exporter([target], port=0)
        try:
            with PrometheusProcess(folder, exporter.url, [f"http://127.0.0.1:{loadgen_port}"], 1.0) as prom:
                prom.wait_scraping()
                served = ServedTarget(
                    name="llama-pushed", quant="pushed", model=args.model.stem, url=server.url
                )

                def drive() -> None:
                    for users, seconds in ((1, args.below_s), (args.users, args.past_s)):
                        requests = min(100, max(users, round(seconds * users / 2)))  # ~2 s each
                        settings = LoadSettings(
                            users=(users,), repeats=1, prompt_count=requests, max_prompt_tokens=300,
                            max_tokens=args.max_tokens, ignore_eos=True, warmup_requests=0,
                            stage_timeout_s=seconds * 3, metrics_port=loadgen_port,
                        )  # fmt: skip
                        deadline = time.monotonic() + seconds
                        while time.monotonic() < deadline:
                            context = RunContext(RunDir(folder), "pushed", Settings(load=settings))
                            run_experiment("sweep", served, context)

                thread = threading.Thread(target=drive, daemon=True)
                started = time.monotonic()
                thread.start()
                print(f"{'t s':>5} {'deferred':>9} {'busy':>5} {'TTFT p99':>9}  " + "  ".join(ALERTS))
                with httpx.Client(timeout=5) as client:
                    while thread.is_alive():
                        time.sleep(args.every_s)
                        values = [_value(client, prom.url, q) for q in QUERIES.values()]
                        states = _alert_states(client, prom.url)
                        t_s = time.monotonic() - started
                        line = f"{t_s:5.0f} {values[0]:>9} {values[1]:>5} {values[2]:>9}  "
                        print(line + "  ".join(f"{states[a]:<{len(a)}}" for a in ALERTS), flush=True)
        finally:
            exporter.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
