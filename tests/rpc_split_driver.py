"""The head host of a model split over hosts, for tests and benchmarks run in network namespaces.

    python tests/rpc_split_driver.py --model M.gguf --rpc HOST:PORT[,HOST:PORT] --out DIR
        [--users 1,2] [--prompts 4] [--max-tokens 8] [--threads 1] [--then-alone] [--wait-for FILE]

Runs inside the head host's namespace (`ip netns exec`): starts a llama-server of the model
offloaded to the given ggml-rpc-servers (quantload.llamacpp.server, as `quantload run` starts it
with server.rpc; no --rpc: the model on this host alone), loads it with the sweep (closed loop,
prompt cache off, fixed-length answers; records and stage lines in DIR), stops it, and prints one
JSON line: the stage summaries, the wall time, the server's exit code and quantload's lines in its
log (a lost RPC host), the devices its log says held the model, and per user level the median
request's prompt and decode tokens/s (the server's timings). With --wait-for it prints a "ready"
line once the server is up and waits (at most 10 minutes) until that file exists before loading it
(a benchmark limits the links meanwhile, after the weights went over them). With --then-alone it then serves
the same model on this host alone and loads it once more (the run going on with the next server
after a fault), and prints a second JSON line.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
import time
from pathlib import Path

from quantload.config import LoadSettings, Settings, ToolchainSettings
from quantload.experiments.registry import run_experiment
from quantload.llamacpp.server import LlamaServer, ServerSpec
from quantload.llamacpp.toolchain import find_toolchain
from quantload.load.records import iter_records
from quantload.run_context import RunContext
from quantload.rundir.handle import RunDir
from quantload.served import ServedTarget

MODEL_BUFFER = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")
WAIT_LIMIT_S = 600.0


def _wait_for(flag: Path | None) -> None:
    if flag is None:
        return
    print(json.dumps({"event": "ready"}), flush=True)
    deadline = time.monotonic() + WAIT_LIMIT_S
    while not flag.exists():
        if time.monotonic() > deadline:
            raise SystemExit(f"{flag} did not appear within {WAIT_LIMIT_S:g} s")
        time.sleep(0.1)


def _server_rates(out: Path, users_of: dict[str, int | None]) -> dict[int, dict[str, float]]:
    """Per user level, the median request's prompt and decode tokens/s as the server timed them."""
    found: dict[int, dict[str, list[float]]] = {}
    if not (out / "records.jsonl").exists():
        return {}
    for record in iter_records(out / "records.jsonl"):
        level = users_of.get(record.stage_id or "")
        if record.warmup or not record.ok or not record.timings or not level:
            continue
        for key in ("prompt_per_second", "predicted_per_second"):
            if record.timings.get(key):
                found.setdefault(level, {}).setdefault(key, []).append(float(record.timings[key]))
    return {level: {k: statistics.median(v) for k, v in rates.items()} for level, rates in found.items()}


def _serve_and_load(
    spec: ServerSpec, load: LoadSettings, out: Path, name: str, toolchain: object, wait_for: Path | None = None,
    level_max_s: float = 5.0,
) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    # a level sends its planned requests, then more while undecided, for at most level_max_s
    settings = Settings.model_validate({"load": load.model_dump(), "slo": {"level_max_s": level_max_s}})
    context = RunContext(RunDir(out), name, settings, cwd=out)
    server = LlamaServer(toolchain, spec, out / f"llama-server-{name}.log", startup_timeout_s=300)  # type: ignore[arg-type]
    started = time.monotonic()
    summaries = []
    ready_s = None
    try:
        server.start()
        ready_s = time.monotonic() - started
        _wait_for(wait_for)
        print(json.dumps({"event": "loading", "name": name, "ready_s": ready_s}), flush=True)
        label = spec.model_path.stem
        target = ServedTarget(name=name, quant=label, model=label, url=server.url)
        summaries = [s.to_dict() for s in run_experiment("sweep", target, context).summaries]
    finally:
        alive = server.alive()
        code = server.stop()
    log = server.log_text()
    return {
        "event": "done",
        "name": name,
        "ready_s": ready_s,
        "wall_s": time.monotonic() - started,
        "server_rates": _server_rates(out, {str(s["stage_id"]): s["users"] for s in summaries}),
        "summaries": summaries,
        "alive_at_end": alive,
        "exit_code": code,
        "quantload_lines": [line for line in log.splitlines() if line.startswith("quantload:")],
        "model_buffers_mib": {m[1]: float(m[2]) for m in MODEL_BUFFER.finditer(log)},
        "rpc_crash": "Remote RPC server crashed" in log,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", type=Path, required=True)
    parser.add_argument("--rpc", default="")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--llama-bin", type=Path, required=True)
    parser.add_argument("--users", default="1,2")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=8)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--lost-after-s", type=float, default=5.0)
    parser.add_argument("--stage-timeout-s", type=float, default=120.0)
    parser.add_argument("--request-timeout-s", type=float, default=60.0)
    parser.add_argument("--then-alone", action="store_true")
    parser.add_argument("--level-max-s", type=float, default=5.0, help="slo.level_max_s of each level")
    parser.add_argument("--wait-for", type=Path, default=None)
    args = parser.parse_args()
    toolchain = find_toolchain(ToolchainSettings(llama_bin=args.llama_bin), {})
    if toolchain is None:
        raise SystemExit("no llama.cpp tools")
    users = tuple(int(u) for u in args.users.split(","))
    load = LoadSettings(
        users=users, repeats=1, prompt_count=args.prompts, max_prompt_tokens=120, max_tokens=args.max_tokens,
        ignore_eos=True, warmup_requests=1, request_timeout_s=args.request_timeout_s,
        first_byte_timeout_s=min(30.0, args.request_timeout_s),
        stage_timeout_s=args.stage_timeout_s, metrics_port=0,
    )  # fmt: skip
    rpc = tuple(e for e in args.rpc.split(",") if e)
    spec = ServerSpec(
        args.model, "tiny", slots=max(users), ctx_per_slot=1024, threads=args.threads, rpc=rpc,
        rpc_lost_after_s=args.lost_after_s,
    )  # fmt: skip
    done = _serve_and_load(
        spec, load, args.out / "split", "split", toolchain, args.wait_for, args.level_max_s
    )
    print(json.dumps(done), flush=True)
    if args.then_alone:
        alone = ServerSpec(args.model, "tiny", slots=max(users), ctx_per_slot=1024, threads=args.threads)
        short = load.model_copy(update={"users": (1,), "prompt_count": 2})
        print(json.dumps(_serve_and_load(
            alone, short, args.out / "alone", "alone", toolchain, level_max_s=args.level_max_s
        )), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
