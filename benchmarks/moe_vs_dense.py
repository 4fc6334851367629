"""A mixture of experts against dense models of its total and of its active size (issue 38).

    .venv/bin/python benchmarks/moe_vs_dense.py [--experts 32 --used 2 --expert-ff 1024 --layers 4]
        [--quant Q4_K_M] [--users 1,2,4] [--threads 1] [--rounds 2]

Writes, the same way (quantload.models.synthetic_moe: random weights, the Qwen2 vocabulary), a
qwen3moe model and two qwen3 models with the same attention, embedding and layers whose dense
feed-forward block is as large as all the experts (equal total) or as the experts one token uses
(equal active); quantizes each to --quant with llama-quantize. For each: the file's size, total
and active parameters, the weight bytes a generated token reads (quantload.roofline.weights) and
one decode step of N users reads (expected, uniform routing), llama-bench pp512/tg128 on the
machine's roofline, then a llama-server (--users' largest slots, 1,024-token slots) loaded by the
sweep at each --users level (closed loop, prompt cache off, fixed-length answers): output tokens/s
of all users together and the prompt tokens/s of a request (the server's own timings). Prints and
writes (benchmarks/figures/moe-vs-dense-*.md and .json) the table and what decode follows
(quantload.analysis.moe_cost), with the load average before and after. --rounds measures each
model that often, the three in turn, and shows the medians (a busy machine's load moves between
them). About 10 minutes a round.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
from quantload.analysis.moe_cost import Comparison, ModelCost, markdown_table  # noqa: E402
from quantload.config import LoadSettings, Settings, SpeedSettings, ToolchainSettings  # noqa: E402
from quantload.experiments.registry import run_experiment  # noqa: E402
from quantload.llamacpp.quantize import quantize  # noqa: E402
from quantload.llamacpp.server import LlamaServer, ServerSpec  # noqa: E402
from quantload.llamacpp.toolchain import Toolchain, ensure_llama_source, find_toolchain  # noqa: E402
from quantload.load.records import iter_records  # noqa: E402
from quantload.models.gguf_meta import read_gguf  # noqa: E402
from quantload.models.moe import file_moe_facts  # noqa: E402
from quantload.models.synthetic_moe import MoeShape, write_dense_twin, write_tiny_moe  # noqa: E402
from quantload.paths import cache_root  # noqa: E402
from quantload.roofline.measure import measure_file_speed  # noqa: E402
from quantload.roofline.probe import probe_in_cache  # noqa: E402
from quantload.roofline.weights import weight_traffic  # noqa: E402
from quantload.run_context import RunContext  # noqa: E402
from quantload.rundir.handle import RunDir  # noqa: E402
from quantload.served import ServedTarget  # noqa: E402

ROLES = ("moe", "dense-total", "dense-active")
CTX_PER_SLOT = 1024


def _write(shape: MoeShape, quant: str, toolchain: Toolchain, folder: Path) -> dict[str, Path]:
    tree = ensure_llama_source(ToolchainSettings(), os.environ)
    folder.mkdir(parents=True, exist_ok=True)
    made: dict[str, Path] = {}
    for role in ROLES:
        f16 = folder / f"{role}-F16.gguf"
        if role == "moe":
            write_tiny_moe(tree, f16, seed=7, shape=shape)
        else:
            size = "total" if role == "dense-total" else "active"
            write_dense_twin(tree, f16, size, seed=7, shape=shape)
        out = folder / f"{role}-{quant}.gguf"
        quantize(toolchain, f16, out, quant, folder / f"quantize-{role}.log")
        f16.unlink()
        made[role] = out
    return made


def _load(
    toolchain: Toolchain, model: Path, users: list[int], args: argparse.Namespace, run_dir: Path
) -> tuple[dict[int, float], dict[int, float]]:
    """Output tok/s of all users per level, and the median request's prompt tok/s per level."""
    shutil.rmtree(run_dir, ignore_errors=True)  # records of an earlier run would be read too
    run_dir.mkdir(parents=True)
    spec = ServerSpec(model, model.stem, slots=max(users), ctx_per_slot=CTX_PER_SLOT, threads=args.threads)
    load = LoadSettings(
        users=tuple(users), repeats=1, prompt_count=args.requests, max_prompt_tokens=200,
        max_tokens=args.max_tokens, ignore_eos=True, warmup_requests=1, request_timeout_s=300,
        stage_timeout_s=900, metrics_port=0,
    )  # fmt: skip
    settings = Settings.model_validate({"load": load.model_dump()})
    context = RunContext(RunDir(run_dir), model.stem, settings, cwd=run_dir)
    with LlamaServer(toolchain, spec, run_dir / "llama-server.log", startup_timeout_s=300) as server:
        target = ServedTarget(name=model.stem, quant=model.stem, model=model.stem, url=server.url)
        summaries = run_experiment("sweep", target, context).summaries
    decode = {s.users: s.output_tok_s for s in summaries if s.status == "ok" and s.users}
    prefill: dict[int, list[float]] = {}
    stage_users = {s.stage_id: s.users for s in summaries}
    for record in iter_records(run_dir / "records.jsonl"):
        if record.warmup or not record.ok or not record.timings:
            continue
        rate = record.timings.get("prompt_per_second")
        level = stage_users.get(record.stage_id or "")
        if rate and level:
            prefill.setdefault(level, []).append(float(rate))
    medians = {u: statistics.median(v) for u, v in prefill.items()}
    return {u: float(v) for u, v in decode.items() if v}, medians


def _median_by_users(rounds: list[dict[int, float]]) -> dict[int, float]:
    """Per user level, the median over the rounds that measured it."""
    levels = sorted({users for found in rounds for users in found})
    return {u: statistics.median(found[u] for found in rounds if u in found) for u in levels}


def _loadavg() -> str:
    return " / ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--experts", type=int, default=32)
    parser.add_argument("--used", type=int, default=2)
    parser.add_argument("--expert-ff", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--embedding", type=int, default=256)
    parser.add_argument("--quant", default="Q4_K_M")
    parser.add_argument("--users", default="1,2,4")
    parser.add_argument("--requests", type=int, default=8, help="prompts per stage")
    parser.add_argument("--max-tokens", type=int, default=64)
    # one thread: two threads on two cores other processes also use stall each other at every
    # barrier (a request's decode swung from 110 to 4 tokens/s between requests of one stage)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="each model measured this often, in turn")
    parser.add_argument("--work", type=Path, default=cache_root(None, os.environ) / "moe-vs-dense")
    args = parser.parse_args()
    users = [int(u) for u in args.users.split(",")]
    llama_bin = os.environ.get("QUANTLOAD_LLAMA_BIN")
    chosen = ToolchainSettings(llama_bin=Path(llama_bin) if llama_bin else None)
    toolchain = find_toolchain(chosen, os.environ)
    if toolchain is None:
        raise SystemExit("llama.cpp tools not built: run `quantload toolchain` first")
    shape = MoeShape(embedding=args.embedding, heads=4, kv_heads=2, layers=args.layers, experts=args.experts,
                     experts_used=args.used, expert_feed_forward=args.expert_ff)  # fmt: skip
    command = "benchmarks/moe_vs_dense.py " + " ".join(sys.argv[1:])
    before, started = _loadavg(), time.monotonic()
    files = _write(shape, args.quant, toolchain, args.work / "models")
    limits = probe_in_cache(cache_root(None, os.environ), SpeedSettings())
    Round = tuple[float, float, dict[int, float], dict[int, float], float, str]  # + the tg ceiling, bound
    measured: dict[str, list[Round]] = {role: [] for role in ROLES}
    for round_index in range(args.rounds):  # the models in turn, the order turning each round
        order = ROLES[round_index % len(ROLES) :] + ROLES[: round_index % len(ROLES)]
        for role in order:
            path = files[role]
            speed = SpeedSettings(reps=3, threads=args.threads)
            bench = measure_file_speed(toolchain, path, speed, limits, role)
            run_dir = args.work / "runs" / f"{role}-{round_index}"
            decode, prefill = _load(toolchain, path, users, args, run_dir)
            tg, pp = bench.bench.decode.tokens_per_s, bench.bench.prefill.tokens_per_s
            roof = bench.roofline.decode
            measured[role].append((tg, pp, decode, prefill, roof.ceiling_tokens_per_s, roof.bound))
            print(
                f"round {round_index + 1} {role}: tg {tg:.1f} tok/s (ceiling {roof.ceiling_tokens_per_s:.1f},"
                f" {roof.bound}, {roof.weight_bytes_per_token / 1e6:.1f} MB per token), pp {pp:.1f},"
                f" served decode {decode}, load {_loadavg()}",
                flush=True,
            )
    costs: dict[str, ModelCost] = {}
    for role, path in files.items():
        summary = read_gguf(path)
        facts = file_moe_facts(summary)
        traffic = weight_traffic(summary)
        rounds = measured[role]
        costs[role] = ModelCost(
            label=path.name, role=role, file_bytes=summary.size_bytes, total_params=summary.n_params,
            active_params=facts.active_params if facts else summary.n_params,
            token_bytes=float(traffic.bytes_per_pass), expert_bytes=traffic.expert_bytes,
            experts_used=traffic.experts_used, expert_count=traffic.expert_count,
            decode_tok_s=_median_by_users([r[2] for r in rounds]),
            prefill_tok_s=_median_by_users([r[3] for r in rounds]),
            bench_decode_tok_s=statistics.median(r[0] for r in rounds),
            bench_prefill_tok_s=statistics.median(r[1] for r in rounds),
            decode_ceiling_tok_s=statistics.median(r[4] for r in rounds), decode_bound=rounds[-1][5],
        )  # fmt: skip
    comparison = Comparison(costs["moe"], costs["dense-total"], costs["dense-active"])
    after = _loadavg()
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%MZ")
    lines = [
        f"# MoE against dense of equal total and equal active size ({stamp})",
        "",
        f"Command: `.venv/bin/python {command}`; {args.quant}; llama-server `-np {max(users)} -c"
        f" {max(users) * CTX_PER_SLOT} -t {args.threads}`, sweep of {args.requests} prompts per level,"
        f" {args.max_tokens} output tokens each, prompt cache off; {args.rounds} rounds, the three models"
        " in turn (the order turning each round), medians shown. Machine bandwidth"
        f" {limits.bandwidth_bytes_per_s / 1e9:.1f} GB/s, {limits.arithmetic_flops_per_s / 1e9:.1f} GFLOP/s."
        f" Load average (1/5/15 min) before {before}, after {after}; {time.monotonic() - started:.0f} s.",
        "",
        f"Shape: embedding {shape.embedding}, {shape.layers} layers, {shape.experts} experts of"
        f" {shape.expert_feed_forward}, {shape.experts_used} used per token; vocabulary 151,936 (Qwen2),"
        " output tied to the embedding. Decode tok/s are all users' output tokens together;"
        " prefill tok/s the median request's prompt rate (server timings).",
        "",
        *markdown_table(comparison, users),
        "",
        *(f"- {sentence}" for sentence in comparison.sentences(users)),
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    figures = REPO / "benchmarks" / "figures"
    (figures / f"moe-vs-dense-{stamp}.md").write_text(text)
    data = {
        role: {
            **cost.__dict__,
            "decode_tok_s": dict(cost.decode_tok_s),
            "prefill_tok_s": dict(cost.prefill_tok_s),
            "step_bytes": {u: cost.step_bytes(u) for u in users},
        }
        for role, cost in costs.items()
    }
    (figures / f"moe-vs-dense-{stamp}.json").write_text(json.dumps(data, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
