"""The ramp-up experiment: its settings and registry entry, its plan (one timed stage per step), the
loop that stops after the first step that misses (the supervisor stubbed), and its report part
from synthetic stage summaries: a hold, a break, an undecided step; the table with its intervals;
the registry and the report picking it up.

The whole experiment against the fake server: tests/integration/load/test_ramp_up_processes.py.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pandas as pd
import pytest
from pydantic import ValidationError

from load_api import context
from quantload.analysis.chapters import chapters, figures
from quantload.analysis.chapters import load as load_chapter
from quantload.analysis.stage_tables import stage_line, summary_from_records
from quantload.config import Settings
from quantload.experiments import registry
from quantload.experiments.base import ExperimentContext
from quantload.experiments.open_loop.report import REPORT as OPEN_LOOP_REPORT
from quantload.experiments.ramp_up import stages as ramp_stages
from quantload.experiments.ramp_up.chapter import step_table
from quantload.experiments.ramp_up.report import REPORT
from quantload.experiments.ramp_up.tables import ramp_outcome, ramp_runs
from quantload.load.prompts import Prompt
from quantload.load.summary import StageSummary
from quantload.load.supervisor import PlanOutcome
from quantload.load.workloads import StageRequests
from quantload.served import ServedTarget
from quantload.slo import Slo

TARGET = ServedTarget(name="llama-q4_k_m", quant="Q4_K_M", model="m", url="http://127.0.0.1:1")
POOL = StageRequests.of_prompts([Prompt(f"p{i}", f"prompt {i}", 2) for i in range(3)])
# a p90 objective decides within a few dozen requests
SLO = Slo(ttft_s=0.1, tpot_s=0.05, ttft_percentile="p90", tpot_percentile="p90", max_failed_frac=0.1)


def settings(**ramp: Any) -> Settings:
    return Settings.model_validate({"ramp_up": ramp, "load": {"warmup_requests": 1}})


# ----------------------------------------------------------------------------- settings and registry


def test_its_settings_are_bounded_and_it_runs_only_when_named() -> None:
    chosen = Settings()
    assert (chosen.ramp_up.step_s, chosen.ramp_up.start_users, chosen.ramp_up.max_users) == (30.0, 1, 8)
    assert ramp_stages.step_users(settings(start_users=3, max_users=5)) == [3, 4, 5]
    for wrong in ({"max_users": 2, "start_users": 3}, {"step_s": 0.5}, {"max_users": 5000}, {"start_users": 0}):
        with pytest.raises(ValidationError):
            settings(**wrong)
    experiment = registry.get("ramp_up")
    assert experiment.by_default is False and experiment.missing(chosen) is None
    assert "ramp_up" in registry.names() and "ramp_up" not in registry.default_names()
    asked = Settings.model_validate({"load": {"experiments": ["sweep", "ramp_up"]}})
    assert [e.name for e in registry.planned(asked)] == ["sweep", "ramp_up"]
    assert [e.name for e in registry.against_any_server(["ramp_up"], chosen)] == ["ramp_up"]


def test_each_step_is_one_timed_stage_at_one_user_more_warm_ups_in_the_first_only() -> None:
    chosen = settings(step_s=20, start_users=2, max_users=4)
    plans = [ramp_stages.step_plan(chosen, TARGET, POOL, i, "run-1", "ramp_up-x") for i in range(3)]
    stages = [plan.stages[0] for plan in plans]
    assert [len(plan.stages) for plan in plans] == [1, 1, 1]
    assert [(s.stage_id, s.users, s.phase) for s in stages] == [
        ("ramp_up-x-0", 2, "step 1/3"), ("ramp_up-x-1", 3, "step 2/3"), ("ramp_up-x-2", 4, "step 3/3"),
    ]  # fmt: skip
    assert {(s.experiment, s.arrival, s.duration_s) for s in stages} == {("ramp_up", "closed", 20.0)}
    assert [len(s.warmup) for s in stages] == [1, 0, 0]
    assert all(s.timeout_s == 20.0 + 300.0 + ramp_stages.STEP_MARGIN_S for s in stages)
    assert all(s.warning is None and s.decision is None for s in stages)  # timed: never crowded


# ----------------------------------------------------------------------------- synthetic steps


def step_summary(
    index: int, users: int, ttfts: Sequence[float], *, failed: int = 0, status: str = "ok", steps: int = 8
) -> StageSummary:
    """A step's summary from synthetic requests (the stage table's own computation)."""
    head = {
        "run_id": "run-1", "server": TARGET.name, "quant": TARGET.quant, "experiment": "ramp_up",
        "stage_id": f"ramp_up-x-{index}", "stage_index": index, "stage_users": users, "arrival": "closed",
        "status": status, "phase": f"step {index + 1}/{steps}", "unix_s": 100.0 + 10 * index,
    }  # fmt: skip
    rows = [
        {"ok": True, "within_deadline": True, "ttft_s": t, "tpot_s": 0.01, "e2e_s": t + 0.1,
         "sent_unix_s": 100.0 + 10 * index + n * 0.01, "completion_tokens": 8, "warmup": False}
        for n, t in enumerate(ttfts)
    ] + [
        {"ok": False, "within_deadline": False, "error_class": "http_500", "sent_unix_s": 100.0, "warmup": False}
        for _ in range(failed)
    ]  # fmt: skip
    summary = summary_from_records(pd.DataFrame(rows), stage_line(head, "stage_end"), SLO)
    return summary.model_copy(update={"started_unix_s": head["unix_s"], "ended_unix_s": head["unix_s"] + 9})


def stage_rows(summaries: Sequence[StageSummary]) -> pd.DataFrame:
    """The stage table's rows of the summaries (stage_tables._row's shape)."""
    rows = []
    for summary in summaries:
        row = summary.model_dump(exclude={"schema_", "slo_counts"})
        row.update({f"slo_{name}": count for name, count in summary.slo_counts.items()})
        rows.append(row)
    return pd.DataFrame(rows)


FAST = [0.01 + 0.0002 * n for n in range(150)]  # all within the limit: meets
SLOW = [0.3 if n % 3 == 2 else 0.02 for n in range(60)]  # a third over the limit, spread: misses
FEW = [0.02] * 4  # undecided: too few to show a p90


def test_a_step_that_misses_ends_the_ramp_and_one_that_meets_or_is_undecided_does_not() -> None:
    assert ramp_stages.step_verdict(step_summary(0, 1, FAST), SLO).outcome == "meets"
    assert ramp_stages.step_verdict(step_summary(0, 1, FEW), SLO).outcome == "undecided"
    assert ramp_stages.ends_the_ramp(step_summary(0, 1, FAST), SLO) is None
    assert ramp_stages.ends_the_ramp(step_summary(0, 1, FEW), SLO) is None
    assert (ramp_stages.ends_the_ramp(step_summary(2, 3, SLOW), SLO) or "").startswith("it misses the SLO")
    aborted = step_summary(1, 2, FAST).model_copy(update={"status": "aborted", "reason": "circuit breaker"})
    assert ramp_stages.ends_the_ramp(aborted, SLO) == "its stage aborted: circuit breaker"
    assert ramp_stages.ends_the_ramp(None, SLO) == "its stage never ended"


def test_the_ramp_runs_one_plan_per_step_and_stops_after_the_first_miss(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran: list[int] = []
    breaks_at: list[int] = [3]

    def fake_run(ctx: ExperimentContext, plan: Any) -> PlanOutcome:
        stage = plan.stages[0]
        ran.append(stage.users)
        ttfts = SLOW if stage.users in breaks_at else FAST
        return PlanOutcome([step_summary(stage.index, stage.users, ttfts)], [])

    monkeypatch.setattr(ramp_stages, "run_stages", fake_run)
    monkeypatch.setattr(ramp_stages, "draw_pool", lambda ctx, invocation: POOL)
    slo = {"ttft_s": 0.1, "ttft_percentile": "p90", "tpot_percentile": "p90", "max_failed_frac": 0.1}
    run = context(tmp_path, ramp_up={"step_s": 2, "max_users": 6}, slo=slo)
    done = ramp_stages.run(ExperimentContext(run, TARGET))
    assert ran == [1, 2, 3] and [s.users for s in done.summaries] == [1, 2, 3]
    assert done.experiment == "ramp_up" and done.problem is None  # a miss is what the ramp looks for
    ran.clear()
    breaks_at.clear()
    ramp_stages.run(ExperimentContext(run, TARGET))
    assert ran == [1, 2, 3, 4, 5, 6]  # no miss: up to max_users


# ----------------------------------------------------------------------------- the report part


def runs_of(*summaries: StageSummary) -> Any:
    (only,) = ramp_runs(stage_rows(summaries), SLO, ("Q4_K_M",))
    return only


def test_a_break_after_steps_that_held_says_where_the_slo_first_breaks() -> None:
    run = runs_of(step_summary(0, 1, FAST), step_summary(1, 2, FAST), step_summary(2, 3, SLOW))
    assert list(run.steps["outcome"]) == ["meets", "meets", "misses"]
    assert (run.held_users, run.breaks_at_users, run.undecided_from_users) == (2, 3, None)
    assert run.sentence.startswith("The SLO first breaks at 3 users: ")
    assert run.sentence.endswith("; it held up to 2 users.")


def test_a_ramp_that_met_every_step_held_up_to_its_last() -> None:
    run = runs_of(*(step_summary(i, i + 1, FAST, steps=3) for i in range(3)))
    assert (run.held_users, run.breaks_at_users, run.missed_users) == (3, None, None)
    assert run.sentence == "The SLO held up to 3 users: the last step (ramp_up.max_users); no step missed."


def test_an_undecided_step_claims_no_hold_or_break_beyond_it() -> None:
    run = runs_of(step_summary(0, 1, FAST), step_summary(1, 2, FEW), step_summary(2, 3, SLOW))
    assert list(run.steps["outcome"]) == ["meets", "undecided", "misses"]
    assert (run.held_users, run.breaks_at_users, run.undecided_from_users, run.missed_users) == (1, None, 2, 3)
    assert run.sentence.startswith("The SLO held up to 1 user; undecided from 2 users: ")
    assert "first breaks" not in run.sentence and "breaks at 3 users at the latest" in run.sentence
    alone = runs_of(step_summary(0, 1, FEW))
    assert alone.held_users is None and alone.sentence.startswith("Undecided from 1 user: ")
    assert "held" not in alone.sentence


def test_a_step_whose_stage_did_not_end_ok_is_judged_on_nothing() -> None:
    run = runs_of(step_summary(0, 1, FAST), step_summary(1, 2, FAST, status="aborted"))
    assert list(run.steps["outcome"]) == ["meets", "incomplete"]
    assert run.sentence.startswith("The SLO held up to 1 user; undecided from 2 users: its stage aborted")


def test_a_break_at_the_first_step_holds_nothing() -> None:
    run = runs_of(step_summary(0, 1, SLOW))
    assert (run.held_users, run.breaks_at_users) == (None, 1)
    assert run.sentence.endswith("; it missed from the first step.")
    assert ramp_outcome([], 8).sentence == "no step of the ramp was measured"


class _Analysis:
    slo = SLO


def test_the_table_shows_each_steps_percentiles_with_their_intervals_and_verdict() -> None:
    run = runs_of(step_summary(0, 1, FAST), step_summary(1, 2, SLOW))
    table = step_table(run, _Analysis())  # type: ignore[arg-type]
    assert table.columns == ("step", "users", "ok / requests", "TTFT p90", "TPOT p90", "verdict")
    first, second = table.rows
    assert first[:3] == ("1", "1", "150 / 150") and first[5] == "meets" and second[5] == "misses"
    shown = re.compile(r"^[\d.]+ ms \[[\d.]+–[\d.]+ ms\]$")  # the value, then its interval
    assert all(shown.match(row[3]) and shown.match(row[4]) for row in table.rows), table.rows
    assert second[3].startswith("300 ms [")
    for step in run.steps.to_dict("records"):
        low, high = step["ttft_at_slo_s_ci"]
        assert low <= step["ttft_at_slo_s"] <= high


def test_the_registry_and_the_report_pick_it_up_after_the_load_chapter() -> None:
    parts = dict((e.name, part) for e, part in registry.reported())
    assert parts["ramp_up"] is REPORT and REPORT.follows == "load" and REPORT.subject == "the ramp-up"
    every = chapters()
    at = every.index(load_chapter.CHAPTER)
    # after the load chapter's last section, the open loop's (its own chapter, earlier in the registry)
    assert every[at + 1 : at + 3] == (OPEN_LOOP_REPORT.chapter, REPORT.chapter)
    assert "ramp_up" in [figure.key for figure in figures()]
    assert set(REPORT.summary(REPORT.findings.__globals__["RampUpFindings"]())) == {"ramp_up"}
