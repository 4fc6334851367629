"""The server-flag experiments and `quantload tune` on SmolLM2-135M (issue 22), measured.

    measure experiments  `quantload run` of Q8_0 with the limit search, then the batching, slots
                         and speculation experiments (the draft: the same model at Q4_K_M)
    measure loaded       batching and speculation again at 4 users (beyond a limit of one user)
    measure tune         `quantload tune` of Q8_0 and Q4_K_M with the default space, twice (does a
                         second tune pick the same winner?), then Q8_0's full grid (every
                         configuration confirmed: tune.finalists = the space's size)
    measure tune-twice   the two tunes without the full grid (`--percentile p90`: both SLO limits'
                         percentile; `--max-failed-frac`: the failed share; `--budget-s`: each
                         tune's budget; `--burst-requests`, `--level-max-s`, `--search-cap-s`: the
                         verdict's burst prior, a level's seconds, the finalists' search cap)
    measure tune-predict one tune without prediction and one with `--predict-first` (issue 36), of
                         Q4_K_M unless `--quants` names others: time spent and winners
    measure tune-2       the second tune alone (`--quants Q8_0`: one quantization's; `--resume RUN_DIR`:
                         go on with an interrupted one)
    render               the tables of those run directories (`--runs` names the JSON the measure
                         step wrote), written under benchmarks/figures/ (file names only)

Each measured command is bounded (the quick profile's limit searches, tune.budget_s), runs under
`nice`, and is stamped with the load average before and after and the share of the CPUs other
processes used meanwhile (quantload.cpu_share).

    .venv/bin/python benchmarks/server_flags_smollm2.py measure experiments --runs /tmp/flags-runs.json
    .venv/bin/python benchmarks/server_flags_smollm2.py measure tune --runs /tmp/flags-runs.json
    .venv/bin/python benchmarks/server_flags_smollm2.py render --runs /tmp/flags-runs.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quantload.cpu_share import mark, other_cpu_frac
from quantload.models.prepared import prepared_folder
from quantload.paths import cache_root

HERE = Path(__file__).resolve().parent
MODEL = "smollm2-135m"
# What every measured command shares: one llama.cpp thread (on two cores that other work keeps
# busy, two threads wait on each other at every step: llama-bench tg16 measured 0.71 tok/s with
# -t 2 against 30.5 with -t 1 at a load average of 14), the quick profile's limit search with a
# longer time cap (a trial takes a minute or more here), shorter prompts (prefill dominates), and
# an SLO this machine can meet (at the default TTFT p99 1 s / TPOT 100 ms barely one user holds).
COMMON: dict[str, dict[str, Any]] = {
    "server": {"threads": 1},
    "slo": {"ttft_s": 3.0, "tpot_s": 0.25},
    "load": {"max_prompt_tokens": 200, "max_tokens": 32},
    "limit": {"time_cap_s": 150.0, "max_users": 16},
}


def _toml(sections: dict[str, dict[str, Any]]) -> str:
    lines = []
    for name, values in sections.items():
        lines.append(f"[{name}]")
        lines += [f"{key} = {json.dumps(value)}" for key, value in values.items()]
        lines.append("")
    return "\n".join(lines)


def experiments_config(out: Path) -> dict[str, dict[str, Any]]:
    draft = prepared_folder(cache_root(None, os.environ), MODEL) / "smollm2-135m-instruct-Q4_K_M.gguf"
    return {
        **COMMON,
        "model": {"source": MODEL, "quants": ["Q8_0"]},
        "run": {"profile": "quick", "out": str(out)},
        "quality": {"kld": False},
        "load": {**COMMON["load"], "experiments": ["limit_users", "batching", "slots", "speculation"]},
        "batching": {"requests": 16},
        "slots": {"kv_cells": 4096},
        "speculation": {
            "draft_model": str(draft),
            "synth_lengths": [2.0, 4.0],
            "requests": 6,
            "max_tokens": 96,
            "prompt_max_tokens": 200,
        },
    }


def tune_config(
    out: Path,
    finalists: int | None = None,
    quants: list[str] | None = None,
    percentile: str | None = None,
    budget_s: float = 1800.0,
    max_failed_frac: float | None = None,
    level_max_s: float | None = None,
    batch_sizes: list[str] | None = None,
    predict_first: bool = False,
    burst_requests: int | None = None,
    search_cap_s: float | None = None,
) -> dict[str, dict[str, Any]]:
    tune: dict[str, Any] = {"budget_s": budget_s, "short_trial_s": 60.0, "predict_first": predict_first}
    if batch_sizes:
        tune["batch_sizes"] = batch_sizes
    if finalists is not None:
        tune["finalists"] = finalists
    if quants is None:
        quants = ["Q8_0", "Q4_K_M"] if finalists is None else ["Q8_0"]
    slo = dict(COMMON["slo"])
    if percentile is not None:
        slo |= {"ttft_percentile": percentile, "tpot_percentile": percentile}
    if max_failed_frac is not None:
        slo |= {"max_failed_frac": max_failed_frac}
    if level_max_s is not None:
        slo |= {"level_max_s": level_max_s}
    if burst_requests is not None:
        slo |= {"burst_requests": burst_requests}
    limit = dict(COMMON["limit"]) | ({"time_cap_s": search_cap_s} if search_cap_s is not None else {})
    return {
        **COMMON,
        "slo": slo,
        "limit": limit,
        "model": {"source": MODEL, "quants": quants},
        "run": {"profile": "quick", "out": str(out)},
        "tune": tune,
    }


def measured(
    name: str, command: list[str], folder: Path, config: dict[str, dict[str, Any]]
) -> dict[str, Any]:
    """Run one quantload command in `folder` with `config` as its quantload.toml."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "quantload.toml").write_text(_toml(config), encoding="utf-8")
    before, since, started = os.getloadavg(), mark(), time.monotonic()
    done = subprocess.run(
        ["nice", "-n", "10", sys.executable, "-m", "quantload.cli.main", *command], cwd=folder
    )
    wall_s, others, after = time.monotonic() - started, other_cpu_frac(since), os.getloadavg()
    out = Path(config["run"]["out"])
    runs = (
        sorted((p for p in out.iterdir() if p.is_dir()), key=lambda p: p.stat().st_mtime)
        if out.is_dir()
        else []
    )
    return {
        "name": name,
        "command": ["quantload", *command],
        "config": config,
        "exit_code": done.returncode,
        "run_dir": str(runs[-1]) if runs else None,
        "wall_s": round(wall_s, 1),
        "load_before": [round(x, 2) for x in before],
        "load_after": [round(x, 2) for x in after],
        "other_cpu_frac": others,
        "finished": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _save(path: Path, entry: dict[str, Any]) -> None:
    runs = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else []
    runs.append(entry)
    path.write_text(json.dumps(runs, indent=2), encoding="utf-8")
    print(
        f"{entry['name']}: exit {entry['exit_code']}, {entry['wall_s']:.0f} s, run {entry['run_dir']}",
        flush=True,
    )


def loaded_config(out: Path, users: int) -> dict[str, dict[str, Any]]:
    """Batching and speculation at a set number of users (beyond the limit, where they differ)."""
    config = experiments_config(out)
    config["load"] = {**COMMON["load"], "experiments": ["batching", "speculation"]}
    config["batching"] = {"requests": 16, "users": users}
    config["speculation"] = {**config["speculation"], "users": users, "synth_lengths": []}
    return config


def measure(
    part: str,
    runs: Path,
    work: Path,
    quants: list[str] | None = None,
    resume: Path | None = None,
    percentile: str | None = None,
    budget_s: float = 1800.0,
    max_failed_frac: float | None = None,
    level_max_s: float | None = None,
    batch_sizes: list[str] | None = None,
    burst_requests: int | None = None,
    search_cap_s: float | None = None,
) -> None:
    if part == "experiments":
        folder = work / "experiments"
        _save(runs, measured("experiments", ["run"], folder, experiments_config(folder / "results")))
        return
    if part == "loaded":
        folder = work / "loaded"
        _save(runs, measured("loaded", ["run"], folder, loaded_config(folder / "results", 4)))
        return
    if part == "tune-predict":
        for attempt, first in (("tune-1", False), ("tune-predicted", True)):
            folder = work / attempt
            picked = quants or ["Q4_K_M"]
            config = tune_config(
                folder / "results", quants=picked, percentile=percentile, budget_s=budget_s,
                max_failed_frac=max_failed_frac, level_max_s=level_max_s, batch_sizes=batch_sizes,
                predict_first=first, burst_requests=burst_requests, search_cap_s=search_cap_s,
            )  # fmt: skip
            _save(runs, measured(attempt, ["tune", "--quants", ",".join(picked)], folder, config))
        return
    attempts = ("tune-2",) if part == "tune-2" else ("tune-1", "tune-2")
    # tune-twice: the two tunes alone (does a second tune name the same winner?), no full grid
    for attempt in attempts:
        folder = work / attempt
        command = ["tune"]
        if quants:
            command += ["--quants", ",".join(quants)]
        if resume is not None and attempt == "tune-2":
            command += ["--resume", str(resume)]
        config = tune_config(
            folder / "results", quants=quants, percentile=percentile, budget_s=budget_s,
            max_failed_frac=max_failed_frac, level_max_s=level_max_s, batch_sizes=batch_sizes,
            burst_requests=burst_requests, search_cap_s=search_cap_s,
        )  # fmt: skip
        _save(runs, measured(attempt, command, folder, config))
    if part in ("tune-2", "tune-twice"):
        return
    folder = work / "grid"
    _save(runs, measured("grid", ["tune"], folder, tune_config(folder / "results", finalists=8)))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="step", required=True)
    run = sub.add_parser("measure")
    run.add_argument(
        "part", choices=("experiments", "loaded", "tune", "tune-2", "tune-twice", "tune-predict")
    )
    run.add_argument(
        "--quants", type=lambda text: text.split(","), help="tune these quantizations only (Q8_0,Q4_K_M)"
    )
    run.add_argument("--resume", type=Path, help="tune-2: go on with this interrupted tune's run directory")
    run.add_argument("--percentile", help="tunes: both SLO limits at this percentile (p90, p99, ...)")
    run.add_argument("--budget-s", type=float, default=1800.0, help="tunes: tune.budget_s")
    run.add_argument("--max-failed-frac", type=float, help="tunes: slo.max_failed_frac")
    run.add_argument("--level-max-s", type=float, help="tunes: slo.level_max_s (seconds a level may take)")
    run.add_argument("--batch-sizes", help="tunes: tune.batch_sizes, comma-separated (e.g. 256/256)")
    run.add_argument(
        "--burst-requests", type=int, help="tunes: slo.burst_requests (1: requests judged independent)"
    )
    run.add_argument("--search-cap-s", type=float, help="tunes: limit.time_cap_s of the finalists' searches")
    run.add_argument("--runs", type=Path, required=True, help="JSON list of the measured runs (appended)")
    run.add_argument("--work", type=Path, default=Path("/tmp/quantload-server-flags"))
    render = sub.add_parser("render")
    render.add_argument("--runs", type=Path, required=True)
    args = parser.parse_args()
    if args.step == "measure":
        measure(
            args.part, args.runs, args.work, args.quants, args.resume, args.percentile, args.budget_s,
            args.max_failed_frac, args.level_max_s, args.batch_sizes.split(",") if args.batch_sizes else None,
            args.burst_requests, args.search_cap_s,
        )  # fmt: skip
    else:
        from server_flags_tables import render_runs  # beside this file

        render_runs(json.loads(args.runs.read_text(encoding="utf-8")), HERE / "figures")


if __name__ == "__main__":
    main()
