"""What one limit-search trial costs quantload itself, from the first trial to the 200th.

A synthetic search: 200 trials of one stage each, every trial's plan run through the real
supervisor (`run_plan`, its watch of records.jsonl and stages.jsonl, the summary written as the
stage ends) and judged by the real judge, with the Locust process replaced by one that appends the
trial's prepared lines (`--requests` records of 128 token gaps each, realistic lines of ~3 KB). So
records.jsonl grows trial by trial as in a long search, and the figure is the bookkeeping alone.

Beside it, what reading the whole of records.jsonl once per trial (what the search did before
each trial read only its own stage's summary) would have cost at the same point.

    .venv/bin/python benchmarks/limit_trial_cost.py [--trials 200] [--requests 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

from quantload.config import LimitSettings, LoadSettings, Settings
from quantload.experiments.limit_trials import judge_trial, trial_plan
from quantload.load.plan import LoadPlan
from quantload.load.processes import LoadProcess
from quantload.load.prompts import Prompt
from quantload.load.records import RequestRecord, iter_records
from quantload.load.supervisor import run_plan
from quantload.load.workloads import StageRequests
from quantload.run_context import RunContext
from quantload.rundir.handle import RunDir
from quantload.served import ServedTarget

APPEND = (
    "import sys\n"
    "open(sys.argv[3], 'a').write(open(sys.argv[1]).read())\n"
    "open(sys.argv[4], 'a').write(open(sys.argv[2]).read())\n"
)
TARGET = ServedTarget(name="synthetic", quant="Q4_K_M", model="m", url="http://127.0.0.1:1")


class PreparedLines:
    """Stands in for the Locust process: appends the trial's records and its two stage lines."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def processes(self, plan_path: Path, run_dir: Path, invocation: str) -> list[LoadProcess]:
        plan = LoadPlan.model_validate_json(plan_path.read_text(encoding="utf-8"))
        (stage,) = plan.stages
        now = time.time()
        records = []
        for index, request in enumerate(stage.requests):
            records.append(
                RequestRecord(
                    run_id=plan.run_id, server=TARGET.name, quant=TARGET.quant, model="m", url=TARGET.url,
                    experiment=stage.experiment, stage_id=stage.stage_id, stage_users=stage.users,
                    cache_prompt=False, prompt_id=request.prompt_id, worker="h:1",
                    intended_unix_s=now + index * 0.01, sent_unix_s=now + index * 0.01, lag_s=0.0,
                    ttft_s=0.2 + index * 0.001, ttft_from_intended_s=0.2 + index * 0.001, e2e_s=1.5,
                    tpot_s=0.01, itl_s=[0.0101] * 128, itl_count=128, completion_tokens=129, ok=True,
                    within_deadline=True,
                    timings={"prompt_ms": 150.0, "predicted_ms": 1300.0, "cache_n": 0.0},
                ).to_json_line()
            )  # fmt: skip
        start = plan.stage_event(stage, "stage_start", now).to_json_line()
        end = plan.stage_event(stage, "stage_end", now + 2, requests_done=len(records),
                               requests_ok=len(records)).to_json_line()  # fmt: skip
        record_file = self.folder / f"{invocation}.records"
        stage_file = self.folder / f"{invocation}.stages"
        record_file.write_text("".join(line + "\n" for line in records), encoding="utf-8")
        stage_file.write_text(f"{start}\n{end}\n", encoding="utf-8")
        argv = (sys.executable, "-c", APPEND, str(record_file), str(stage_file),
                str(run_dir / "records.jsonl"), str(run_dir / "stages.jsonl"))  # fmt: skip
        return [LoadProcess("local", argv, f"locust-{invocation}-local.log")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--requests", type=int, default=40, help="records per trial")
    args = parser.parse_args()
    settings = Settings(load=LoadSettings(metrics_port=0, warmup_requests=0), limit=LimitSettings())
    prompts = [Prompt(f"p{i}", f"prompt {i}", 3) for i in range(args.requests)]
    drawn = StageRequests.of_prompts(prompts)
    with tempfile.TemporaryDirectory() as folder:
        run_dir = Path(folder) / "run"
        context = RunContext(RunDir(run_dir), "synthetic", settings, cwd=Path(folder))
        layout = PreparedLines(Path(folder))
        ours, before = [], []
        for trial in range(args.trials):
            plan = trial_plan(settings, TARGET, drawn, "limit_users", 10.0, "synthetic", f"s-t{trial}", trial)
            started = time.perf_counter()
            outcome = run_plan(plan, context, layout=layout)
            verdict = judge_trial(outcome.summaries[0], context.slo, settings.limit.hard_failure_frac)
            ours.append(time.perf_counter() - started)
            assert verdict.outcome != "misses", verdict.why
            started = time.perf_counter()
            head = f"{plan.invocation}-"
            mine = [r for r in iter_records(run_dir / "records.jsonl") if (r.stage_id or "").startswith(head)]
            before.append(time.perf_counter() - started)
            assert len(mine) == args.requests
        size_mb = (run_dir / "records.jsonl").stat().st_size / 1e6
    print(f"{args.trials} trials of {args.requests} records each; records.jsonl grew to {size_mb:.1f} MB")
    print("trials      per trial now (median ms)   reading all records.jsonl once more (median ms)")
    for low, high in ((0, 10), (45, 55), (95, 105), (args.trials - 10, args.trials)):
        window_ours = ours[low:high]
        window_before = before[low:high]
        if window_ours:
            print(
                f"{low + 1:>4}-{high:<4}  {statistics.median(window_ours) * 1000:>12.1f}"
                f"                {statistics.median(window_before) * 1000:>12.1f}"
            )
    first, last = statistics.median(ours[:10]), statistics.median(ours[-10:])
    print(f"last ten trials against the first ten: x{last / first:.2f} (flat is x1)")


if __name__ == "__main__":
    main()
