"""How often the SLO verdict is wrong, on servers whose tail is known (issue 32's known-truth table).

A p99 TTFT objective of 1 s (1 % of requests may be over it) judged on requests of which a known
share is over the limit: 0.1 %, 0.5 % (a level that meets), 1.5 %, 3 % and 10 % (one that misses),
slow at random or in bursts. Two parts:

1. The decision itself, many runs a design: the fake server's own slow-request process
   (quantload.load.fakeserver.SlowEpisodes) drawn request by request and fed, in the order the
   requests arrive, to the level judgement the load runs (quantload.load.level_judgement) until it
   decides or the budget (the full profile's slo.level_max_requests) ends; beside it today's
   fixed-size judge (before this issue: a level meets unless a one-sided binomial test shows more
   than 1 % over at p < 5 %) on the first 10 and 100 requests, the sizes of a quick trial and a
   full sweep stage. Designs: slow at random (1 user), in bursts that hit the requests in flight
   together (a stall: bursts of 4 at 4 users, of 8 at 8 users), and bursts longer than the
   requests in flight (4 in a row at 1 user) with the default prior and with slo.burst_requests=4.
2. Through the real load (`--http`): a fake server with the same tails serves one plan whose stages
   each decide a level of their own (Locust processes, records, the stage controller's decisions),
   so the pipeline's rates can be set beside part 1's; and the capacity fake: K slots served at
   once (max_streams), the limit search for the most users run `--searches` times, the limit found
   against K.

Prints, per design and share: meets / misses / undecided rates, false meets (a "meets" where the
share is above 1 %), requests per decision (mean, p90), and today's judge's meets rate; then the
HTTP checks. Writes the tables to benchmarks/figures/verdict-truth-<stamp>.{md,json}.

    .venv/bin/python benchmarks/verdict_truth.py [--runs 100] [--budget 5000] [--http] [--searches 10]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from quantload.load.fakeserver import SlowEpisodes
from quantload.load.level_judgement import LevelJudgement
from quantload.slo import Slo

SHARES = (0.001, 0.005, 0.015, 0.03, 0.10)
ALLOWED = 0.01
FIGURES = Path(__file__).parent / "figures"


@dataclass(frozen=True)
class Design:
    """A server's tail: slow requests in episodes of `burst`, judged at `users` in flight."""

    name: str
    burst: int
    users: int
    burst_requests: int = 0  # slo.burst_requests (0: the requests in flight)


DESIGNS = (
    Design("random, 1 user", 1, 1),
    Design("bursts of 4 at 4 users", 4, 4),
    Design("bursts of 8 at 8 users", 8, 8),
    Design("bursts of 4 at 1 user (longer than in flight)", 4, 1),
    Design("same, slo.burst_requests = 4", 4, 1, 4),
)


@dataclass(frozen=True)
class Cell:
    design: str
    share: float
    runs: int
    meets: float
    misses: float
    undecided: float
    requests_mean: float
    requests_p90: int
    decided_requests_mean: float | None
    old_meets_10: float
    old_meets_100: float

    @property
    def false_meets(self) -> float | None:
        return self.meets if self.share > ALLOWED else None


def old_judge_meets(over: Sequence[bool], requests: int) -> bool:
    """Today's fixed-size judge on the first `requests`: meets unless a binomial test shows more
    than 1 % over (p < 5 %)."""
    from scipy.stats import binomtest

    count = sum(over[:requests])
    if count == 0 or count / requests <= ALLOWED:
        return True
    return bool(binomtest(count, requests, ALLOWED, alternative="greater").pvalue >= 0.05)


def one_run(design: Design, share: float, budget: int, seed: int) -> tuple[str, int, bool, bool]:
    """One level judged as the load judges it: (outcome, requests, old meets at 10, at 100)."""
    slo = Slo(1.0, 10.0, burst_requests=design.burst_requests)
    level = LevelJudgement(slo, design.users, False, None, budget, 1e9)
    episodes = SlowEpisodes(share, design.burst, random.Random(seed))
    over: list[bool] = []
    outcome = "undecided"
    while level.requests < budget:
        slow = episodes.next_is_slow()
        over.append(slow)
        outcome = level.add(True, True, 2.0 if slow else 0.1, None, 0.01, 1.0)
        if outcome != "undecided":
            break
    while len(over) < 100:
        over.append(episodes.next_is_slow())
    return outcome, level.requests, old_judge_meets(over, 10), old_judge_meets(over, 100)


def _cell(job: tuple[Design, float, int, int, int]) -> Cell:
    design, share, runs, budget, seed = job
    results = [one_run(design, share, budget, seed * 100_003 + run) for run in range(runs)]
    outcomes = [r[0] for r in results]
    used = sorted(r[1] for r in results)
    decided = [r[1] for r in results if r[0] != "undecided"]
    return Cell(
        design=design.name,
        share=share,
        runs=runs,
        meets=outcomes.count("meets") / runs,
        misses=outcomes.count("misses") / runs,
        undecided=outcomes.count("undecided") / runs,
        requests_mean=statistics.mean(used),
        requests_p90=used[min(len(used) - 1, math.ceil(0.9 * len(used)) - 1)],
        decided_requests_mean=statistics.mean(decided) if decided else None,
        old_meets_10=sum(r[2] for r in results) / runs,
        old_meets_100=sum(r[3] for r in results) / runs,
    )


def decisions(runs: int, budget: int, workers: int) -> list[Cell]:
    jobs = [(d, s, runs, budget, i * 10 + j) for i, d in enumerate(DESIGNS) for j, s in enumerate(SHARES)]
    with ProcessPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(_cell, jobs))


# ----------------------------------------------------------------------------- through the load


def http_decisions(
    share: float, burst: int, users: int, stages: int, budget: int, out: Path
) -> dict[str, object]:
    """`stages` levels decided through the real load against a fake with this tail: one plan whose
    stages each decide a level of their own (a 30 ms TTFT limit; a fast request takes 5 ms to its
    first token, a slow one 60 ms)."""
    from quantload.config import LoadSettings, Settings, SloSettings
    from quantload.load.fakeserver import FakeScript, FakeServerProcess
    from quantload.load.plan import StageDecision, assemble_plan, stage_plan
    from quantload.load.prompts import load_builtin
    from quantload.load.supervisor import run_plan
    from quantload.load.workloads import PromptSetWorkload
    from quantload.run_context import RunContext
    from quantload.rundir.handle import RunDir
    from quantload.served import ServedTarget

    script = FakeScript(
        ttft_ms=(5.0, 5.0), itl_ms=(2.0, 2.0), tokens=4, close_after_stream=True, pathological=False,
        slow_frac=share, slow_ttft_ms=60.0, slow_burst=burst, seed=int(share * 1e6) + burst,
    )  # fmt: skip
    slo = SloSettings(ttft_s=0.03, tpot_s=0.05, level_max_requests=budget, level_max_s=600.0)
    load = LoadSettings(
        metrics_port=0, warmup_requests=0, request_timeout_s=20, max_tokens=4, first_round_jitter_s=0.002
    )
    settings = Settings(load=load, slo=slo)
    drawn = PromptSetWorkload(load_builtin()).stage_requests(20, 1, "h-")
    with FakeServerProcess(script) as fake:
        target = ServedTarget(name="fake", quant="tail", model="m", url=fake.url)
        planned = [
            stage_plan(
                load,
                "truth",
                index,
                "sweep",
                users,
                drawn,
                timeout_s=900.0,
                decision=StageDecision(
                    level=f"truth-L{index}",
                    slo=Slo.of(slo),
                    max_requests=budget,
                    max_s=600.0,
                    min_requests=max(users, 2),
                ),
            )
            for index in range(stages)
        ]
        plan = assemble_plan(load, target, "truth", "truth", [drawn], planned)
        outcome = run_plan(plan, RunContext(RunDir(out), "truth", settings, cwd=out))
    said = [s.level_outcome or "unjudged" for s in outcome.summaries]
    requests = [s.requests for s in outcome.summaries]
    return {
        "share": share, "burst": burst, "users": users, "levels": len(said), "meets": said.count("meets"),
        "misses": said.count("misses"), "undecided": said.count("undecided"),
        "requests_mean": round(statistics.mean(requests)) if requests else None,
    }  # fmt: skip


TTFT_MS = 5.0  # the capacity fake's time to the first token
ITL_MS = 10.0  # and between its 10 tokens
CAPACITY_TTFT_LIMIT_S = 0.020


def capacity_searches(searches: int, slots: int, out: Path) -> list[dict[str, object]]:
    """The limit search for users against a fake serving `slots` streams at once, `searches` times."""
    from quantload.config import LimitSettings, LoadSettings, Settings, SloSettings
    from quantload.experiments.registry import run_experiment
    from quantload.load.fakeserver import FakeScript, FakeServerProcess
    from quantload.run_context import RunContext
    from quantload.rundir.handle import RunDir
    from quantload.served import ServedTarget

    # In a closed loop of N users against K slots, a stream of S ms (5 ms to the first token, then
    # 9 gaps of ITL_MS) and no think time, the server finishes K streams every S ms, so each user's
    # cycle is N*S/K ms and every request waits S*(N/K - 1) for a slot once N > K: its TTFT is
    # 5 ms up to K users and 5 + S*(N/K - 1) ms beyond (36.7 ms at 4 users of K = 3). The TTFT
    # limit (20 ms) sits 15 ms above the first and 16.7 ms below the second, wide of scheduling
    # noise, so the search's truth is K. (The first design, 2 ms gaps and a 15 ms limit, put K + 1
    # users at 12.7 ms, under its own limit, and 2 users 10 ms from a false miss: it found "K" in 8
    # of 10 searches partly because noise pushed K + 1 over.)
    stream_ms = TTFT_MS + 9 * ITL_MS
    script = FakeScript(
        ttft_ms=(TTFT_MS, TTFT_MS), itl_ms=(ITL_MS, ITL_MS), tokens=10, max_streams=slots,
        close_after_stream=True, pathological=False,
    )  # fmt: skip
    settings = Settings(
        load=LoadSettings(
            metrics_port=0, warmup_requests=1, request_timeout_s=20, first_round_jitter_s=0.002
        ),
        limit=LimitSettings(max_users=32, requests_per_user=8, min_requests=16, time_cap_s=900),
        slo=SloSettings(ttft_s=CAPACITY_TTFT_LIMIT_S, tpot_s=0.05, level_max_s=120.0),
    )
    print(
        f"  truth: TTFT {TTFT_MS:.0f} ms up to {slots} users, {TTFT_MS + stream_ms / slots:.1f} ms at"
        f" {slots + 1} and more beyond; limit {CAPACITY_TTFT_LIMIT_S * 1000:.0f} ms",
        flush=True,
    )
    found = []
    with FakeServerProcess(script) as fake:
        target = ServedTarget(name="fake", quant="K-slots", model="m", url=fake.url)
        for index in range(searches):
            folder = out / f"search-{index}"
            started = time.monotonic()
            done = run_experiment(
                "limit_users", target, RunContext(RunDir(folder), f"s{index}", settings, cwd=folder)
            )
            line = done.limit
            found.append(
                {
                    "limit": line.limit if line else None,
                    "lowest_miss": line.lowest_miss if line else None,
                    "undecided": line.undecided if line else None,
                    "trials": [(t.level, t.outcome) for t in line.trials] if line else [],
                    "requests": sum(s.requests for s in done.summaries),
                    "seconds": round(time.monotonic() - started, 1),
                }
            )
            print(f"  search {index + 1}: {found[-1]}", flush=True)
    return found


# ----------------------------------------------------------------------------- output


def percent(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f} %"


def table(cells: Sequence[Cell]) -> list[str]:
    lines = [
        "| design | share over | meets | misses | undecided | false meets | requests mean | p90 |"
        " decided after (mean) | today's judge meets at 10 / 100 requests |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for c in cells:
        decided = "–" if c.decided_requests_mean is None else f"{c.decided_requests_mean:.0f}"
        lines.append(
            f"| {c.design} | {c.share * 100:.1f} % | {percent(c.meets)} | {percent(c.misses)} |"
            f" {percent(c.undecided)} | {percent(c.false_meets)} | {c.requests_mean:.0f} | {c.requests_p90} |"
            f" {decided} | {percent(c.old_meets_10)} / {percent(c.old_meets_100)} |"
        )
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="runs per design and share (at least 50)")
    parser.add_argument(
        "--budget", type=int, default=10000, help="requests a level may send (the full profile's)"
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--http", action="store_true", help="also decide through the real load")
    parser.add_argument(
        "--http-only", action="store_true", help="only the part through the real load (part 1 left out)"
    )
    parser.add_argument(
        "--capacity-only", action="store_true", help="only the capacity fake's limit searches"
    )
    parser.add_argument("--http-stages", type=int, default=10, help="levels per share through the load")
    parser.add_argument("--searches", type=int, default=10, help="limit searches of the capacity fake")
    parser.add_argument("--slots", type=int, default=3, help="the capacity fake's streams at once")
    args = parser.parse_args()
    if args.runs < 50:
        parser.error("--runs must be at least 50")
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    load_before = os.getloadavg()
    started = time.monotonic()
    only = args.http_only or args.capacity_only
    cells = [] if only else decisions(args.runs, args.budget, args.workers)
    args.http = args.http or only
    took = time.monotonic() - started
    flag = (
        " --capacity-only" if args.capacity_only else " --http-only" if args.http_only
        else " --http" if args.http else ""
    )  # fmt: skip
    lines = [
        f"# Verdict against known truth ({stamp})",
        "",
        f"p99 TTFT objective (1 % allowed over), 95 % confidence, budget {args.budget} requests a level,"
        f" {args.runs} runs a cell; {took:.0f} s on {args.workers} workers; load average before"
        f" {load_before[0]:.2f}. Command: `python benchmarks/verdict_truth.py --runs {args.runs}"
        f" --budget {args.budget}{flag}{'' if args.http_only else f' --searches {args.searches}'}`.",
        "",
        *(table(cells) if cells else [f"(part 1, the decision alone, left out:{flag})"]),
    ]
    print("\n".join(lines), flush=True)
    report: dict[str, object] = {
        "stamp": stamp,
        "runs": args.runs,
        "budget": args.budget,
        "cells": [asdict(c) for c in cells],
    }
    if args.http:
        with tempfile.TemporaryDirectory(prefix="verdict-truth-") as folder:
            out = Path(folder)
            print("\nthrough the load:", flush=True)
            http_rows = []
            designs = () if args.capacity_only else ((0.001, 1, 1), (0.10, 1, 1), (0.03, 4, 4))
            for share, burst, users in designs:
                row = http_decisions(
                    share, burst, users, args.http_stages, args.budget, out / f"h{share}-{burst}"
                )
                http_rows.append(row)
                print(f"  {row}", flush=True)
            print(f"\ncapacity fake ({args.slots} slots), {args.searches} limit searches:", flush=True)
            searches = capacity_searches(args.searches, args.slots, out / "capacity")
        exact = sum(1 for s in searches if s["limit"] == args.slots)
        lines += [] if args.capacity_only else [
            "",
            "## Through the load",
            "",
            "| share over | burst | users | levels | meets | misses | undecided | requests mean |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]  # fmt: skip
        for row in http_rows:
            lines.append(
                f"| {float(row['share']) * 100:.1f} % | {row['burst']} | {row['users']} | {row['levels']} |"
                f" {row['meets']} | {row['misses']} | {row['undecided']} | {row['requests_mean']} |"
            )
        lines += [
            "",
            f"Capacity fake with {args.slots} slots (TTFT {TTFT_MS:.0f} ms, 10 tokens {ITL_MS:.0f} ms"
            f" apart, TTFT limit {CAPACITY_TTFT_LIMIT_S * 1000:.0f} ms at p99): the limit found exactly"
            f" in {exact} of {len(searches)} searches.",
            "",
            "| search | limit | misses from | undecided | trials | requests | seconds |",
            "|---:|---:|---:|---|---|---:|---:|",
        ]
        for index, s in enumerate(searches, start=1):
            lines.append(
                f"| {index} | {s['limit']} | {s['lowest_miss']} | {s['undecided']} | {s['trials']} |"
                f" {s['requests']} | {s['seconds']} |"
            )
        report["http"] = http_rows
        report["capacity"] = {"slots": args.slots, "exact": exact, "searches": searches}
        print("\n".join(lines[-(len(searches) + 12) :]), flush=True)
    FIGURES.mkdir(exist_ok=True)
    (FIGURES / f"verdict-truth-{stamp}.md").write_text("\n".join(lines) + "\n")
    (FIGURES / f"verdict-truth-{stamp}.json").write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwritten: {FIGURES / f'verdict-truth-{stamp}.md'}")


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).parent))
    main()
