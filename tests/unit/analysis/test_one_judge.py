"""One judge: the limit search's trial verdict and the report's level verdict are the same on the
same records, and the report judges every open-loop stage (a trace replay too) from the intended
send time, so a client that lagged cannot hide it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from quantload.analysis.capacity import capacity
from quantload.analysis.run_data import load_run
from quantload.analysis.stage_tables import level_table, stage_table
from quantload.experiments.limit_trials import judge_trial
from quantload.load.records import RequestRecord, StageEvent
from quantload.load.summary import summarize_stage
from quantload.slo import Slo

SLO = Slo(ttft_s=0.5, tpot_s=0.05)


def record(stage: str, experiment: str, index: int, ttft: float, ok: bool = True, lag: float = 0.0,
           rate: float | None = None) -> RequestRecord:  # fmt: skip
    return RequestRecord(
        run_id="r", server="llama-q8_0", quant="Q8_0", model="m", url="http://127.0.0.1:1", experiment=experiment,
        stage_id=stage, stage_users=4, stage_rate_rps=rate, cache_prompt=False, prompt_id=f"p{index}",
        worker="h:1", intended_unix_s=100.0 + index - lag, sent_unix_s=100.0 + index, lag_s=lag,
        ttft_s=ttft if ok else None, ttft_from_intended_s=ttft + lag if ok else None,
        tpot_s=0.01 if ok else None, e2e_s=ttft + 0.2 if ok else None, completion_tokens=20 if ok else None,
        ok=ok, within_deadline=ok, error_class=None if ok else "http_5xx",
    )  # fmt: skip


def line(stage: str, experiment: str, event: str, requests: int, arrival: str | None = "closed",
         rate: float | None = None) -> StageEvent:  # fmt: skip
    fields: dict[str, Any] = {
        "event": event, "unix_s": 100.0 if event == "stage_start" else 200.0, "run_id": "r",
        "server": "llama-q8_0", "quant": "Q8_0", "experiment": experiment, "stage_id": stage, "stage_index": 0,
        "stage_users": 4, "stage_rate_rps": rate, "cache_prompt": False, "requests_planned": requests,
    }  # fmt: skip
    if arrival is not None:
        fields["arrival"] = arrival
    return StageEvent.model_validate(fields)


def write_run(run_dir: Path, records: list[RequestRecord], lines: list[StageEvent]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "records.jsonl").write_text("".join(r.to_json_line() + "\n" for r in records))
    (run_dir / "stages.jsonl").write_text("".join(e.to_json_line() + "\n" for e in lines))
    (run_dir / "run.json").write_text(json.dumps({"status": "finished", "steps": []}))


CASES = {
    "all within": ([0.1] * 12, 0),
    "one slow of twelve (chance)": ([0.1] * 11 + [2.0], 0),
    "three slow of twelve": ([0.1] * 9 + [2.0] * 3, 0),
    "one failed of twelve": ([0.1] * 12, 1),
    "half failed": ([0.1] * 12, 6),
}


@pytest.mark.parametrize("ttfts, failed", list(CASES.values()), ids=list(CASES))
def test_a_trial_and_a_sweep_level_of_the_same_records_get_the_same_verdict(
    tmp_path: Path, ttfts: list[float], failed: int
) -> None:
    sweep = [record("sweep-0", "sweep", i, t, ok=i >= failed) for i, t in enumerate(ttfts)]
    trial = [r.model_copy(update={"stage_id": "trial-0", "experiment": "limit_users"}) for r in sweep]
    summary = summarize_stage(line("trial-0", "limit_users", "stage_end", len(trial)), trial, SLO)
    searched = judge_trial(summary, SLO, hard_failure_frac=1.0)  # no early break: the plain verdict

    write_run(tmp_path, sweep, [line("sweep-0", "sweep", e, len(sweep)) for e in ("stage_start", "stage_end")])
    run = load_run(tmp_path)
    levels = level_table(stage_table(run, SLO), "sweep", "users", ["Q8_0"], run.records, SLO)
    (verdict,) = capacity(levels, ["Q8_0"], SLO)
    (check,) = verdict.checks
    assert check.outcome == searched.outcome
    assert check.requests == searched.requests == len(ttfts)
    assert check.sureness == searched.sureness


def test_the_report_counts_the_lag_of_a_trace_replay_whose_client_fell_behind(tmp_path: Path) -> None:
    # the server answered every request in 100 ms, but the client sent them 2 s late
    lagged = [record("trace-0", "trace", i, 0.1, lag=2.0, rate=1.0) for i in range(10)]
    for arrival in ("trace", None):  # a run written before stage lines said their arrival process
        folder = tmp_path / str(arrival)
        ends = [line("trace-0", "trace", e, 10, arrival=arrival, rate=1.0) for e in ("stage_start", "stage_end")]
        write_run(folder, lagged, ends)
        (row,) = stage_table(load_run(folder), SLO).to_dict("records")
        assert (row["ok"], row["good"], row["goodput_rps"]) == (10, 0, 0.0)  # none met 500 ms from its time
        assert row["ttft_p99_s"] == pytest.approx(0.1) and row["ttft_from_intended_p99_s"] == pytest.approx(2.1)
    on_time = [r.model_copy(update={"lag_s": 0.0, "ttft_from_intended_s": 0.1}) for r in lagged]
    write_run(tmp_path / "on-time", on_time, ends)
    (row,) = stage_table(load_run(tmp_path / "on-time"), SLO).to_dict("records")
    assert row["good"] == 10
