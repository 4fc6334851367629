"""The head host of a model split over hosts, for tests and benchmarks run in network namespaces.

    python tests/rpc_split_driver.py --model M.gguf --rpc HOST:PORT[,HOST:PORT] --out DIR
        [--users 1,2] [--prompts 4] [--max-tokens 8] [--threads 1] [--then-alone]

Runs inside the head host's namespace (`ip netns exec`): starts a llama-server of the model
offloaded to the given ggml-rpc-servers (quantload.llamacpp.server, as `quantload run` starts it
with server.rpc; no --rpc: the model on this host alone), loads it with the sweep (closed loop,
prompt cache off, fixed-length answers; records and stage lines in DIR), stops it, and prints one
JSON line: the stage summaries, the wall time, the server's exit code and quantload's lines in its
log (a lost RPC host), the devices its log says held the model. With --then-alone it then serves
the same model on this host alone and loads it once more (the run going on with the next server
after a fault), and prints a second JSON line.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

from quantload.config import LoadSettings, Settings, ToolchainSettings
from quantload.llamacpp.server import LlamaServer, ServerSpec
from quantload.llamacpp.toolchain import find_toolchain
from quantload.run_context import RunContext
from quantload.rundir.handle import RunDir
from quantload.served import ServedTarget
from quantload.steps.load import run_experiment

MODEL_BUFFER = re.compile(r"load_tensors:\s+(\S+) model buffer size =\s+([\d.]+) MiB")


def _serve_and_load(
    spec: ServerSpec, load: LoadSettings, out: Path, name: str, toolchain: object
) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    settings = Settings.model_validate({"load": load.model_dump()})
    context = RunContext(RunDir(out), name, settings, cwd=out)
    server = LlamaServer(toolchain, spec, out / f"llama-server-{name}.log", startup_timeout_s=300)  # type: ignore[arg-type]
    started = time.monotonic()
    summaries = []
    try:
        server.start()
        ready_s = time.monotonic() - started
        print(json.dumps({"event": "loading", "name": name, "ready_s": ready_s}), flush=True)
        target = ServedTarget(name=name, quant="Q4_K_M", model="tiny", url=server.url)
        summaries = [s.to_dict() for s in run_experiment("sweep", target, context).summaries]
    finally:
        alive = server.alive()
        code = server.stop()
    log = server.log_text()
    return {
        "event": "done",
        "name": name,
        "wall_s": time.monotonic() - started,
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
    parser.add_argument("--then-alone", action="store_true")
    args = parser.parse_args()
    toolchain = find_toolchain(ToolchainSettings(llama_bin=args.llama_bin), {})
    if toolchain is None:
        raise SystemExit("no llama.cpp tools")
    users = tuple(int(u) for u in args.users.split(","))
    load = LoadSettings(
        users=users, repeats=1, prompt_count=args.prompts, max_prompt_tokens=120, max_tokens=args.max_tokens,
        ignore_eos=True, warmup_requests=1, request_timeout_s=60, first_byte_timeout_s=30,
        stage_timeout_s=args.stage_timeout_s, metrics_port=0,
    )  # fmt: skip
    rpc = tuple(e for e in args.rpc.split(",") if e)
    spec = ServerSpec(
        args.model, "tiny", slots=max(users), ctx_per_slot=1024, threads=args.threads, rpc=rpc,
        rpc_lost_after_s=args.lost_after_s,
    )  # fmt: skip
    print(json.dumps(_serve_and_load(spec, load, args.out / "split", "split", toolchain)), flush=True)
    if args.then_alone:
        alone = ServerSpec(args.model, "tiny", slots=max(users), ctx_per_slot=1024, threads=args.threads)
        short = load.model_copy(update={"users": (1,), "prompt_count": 2})
        print(json.dumps(_serve_and_load(alone, short, args.out / "alone", "alone", toolchain)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
