"""The ramp-up's tables: per ramp (one per quantization and server) each step's users, requests,
TTFT and TPOT at the SLO's percentiles with their confidence intervals, and its verdict; and the
sentence that says where the SLO first breaks.

A ramp is found by its stages (experiment `ramp_up`, ids `<invocation>-<index>`); each step's
figures are its stage's row of the stage table (the same summary every stage gets, its intervals
at the SLO's confidence). Each step is judged as the sweep's levels are (analysis.capacity
.check_level: quantload.slo's judge on its counts); a step whose stage did not end ok is judged
on nothing. The sentence claims only what the verdicts show: a hold up to the last step of an
unbroken run of steps that meet, a break at the first step that misses when every step before it
met, and otherwise where the steps became undecided (and where one missed after that).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.capacity import check_level
from quantload.analysis.stage_tables import USABLE
from quantload.experiments.ramp_up.stages import NAME
from quantload.slo import Slo

STEP_COLUMNS: tuple[str, ...] = (
    "step", "users", "stage_id", "status", "requests", "ok", "failed", "ttft_at_slo_s",
    "ttft_at_slo_s_ci", "tpot_at_slo_s", "tpot_at_slo_s_ci", "started_unix_s", "ended_unix_s",
    "outcome", "why", "sureness",
)  # fmt: skip
INCOMPLETE = "incomplete"  # a step whose stage did not end ok: judged on nothing


@dataclass(frozen=True)
class RampRun:
    """One ramp of one server: each step, how many were planned, and what the verdicts show."""

    server: str
    quant: str
    invocation: str
    steps: pd.DataFrame  # STEP_COLUMNS, in step order
    steps_planned: int | None
    held_users: int | None  # the last step of the unbroken run of steps that meet from the first
    breaks_at_users: int | None  # the first step that misses, every step before it met
    undecided_from_users: int | None  # the first step neither met nor missed, before any miss
    missed_users: int | None  # the first step that misses, whatever came before it
    sentence: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "quant": self.quant,
            "invocation": self.invocation,
            "steps_planned": self.steps_planned,
            "held_users": self.held_users,
            "breaks_at_users": self.breaks_at_users,
            "undecided_from_users": self.undecided_from_users,
            "missed_users": self.missed_users,
            "sentence": self.sentence,
            "steps": self.steps.to_dict("records"),
        }


def _step_of(phase: object) -> tuple[int, int | None]:
    """'step 3/8' as (3, 8); (0, None) for a phase that is none."""
    found = re.match(r"step (\d+)/(\d+)", str(phase or ""))
    return (int(found.group(1)), int(found.group(2))) if found else (0, None)


def _interval(row: dict[str, Any], name: str) -> list[float | None] | None:
    intervals = row.get("intervals")
    found = intervals.get(name) if isinstance(intervals, dict) else None
    return list(found) if isinstance(found, (tuple, list)) and len(found) == 2 else None


def _untrusted(row: dict[str, Any]) -> str | None:
    """Why the client's timing may be worse than its stated error (StageSummary.client_untrusted)."""
    trust = row.get("client_trust")
    if trust in ("degraded", "saturated"):
        why = row.get("client_trust_why")
        return why if isinstance(why, str) and why else f"the client was {trust}"
    return None


def step_row(stage: dict[str, Any], slo: Slo) -> dict[str, Any]:
    """One step: its stage's figures and its verdict, judged as a sweep level is."""
    step, _ = _step_of(stage.get("phase"))
    users = int(fmt.cell_float(stage.get("users")) or 0)
    busy = stage.get("machine_busy")
    base = {
        "step": step,
        "users": users,
        "stage_id": stage.get("stage_id"),
        "status": stage.get("status"),
        "requests": stage.get("requests"),
        "ok": stage.get("ok"),
        "failed": stage.get("failed"),
        "ttft_at_slo_s": fmt.cell_float(stage.get("ttft_at_slo_s")),
        "ttft_at_slo_s_ci": _interval(stage, "ttft_at_slo_s"),
        "tpot_at_slo_s": fmt.cell_float(stage.get("tpot_at_slo_s")),
        "tpot_at_slo_s_ci": _interval(stage, "tpot_at_slo_s"),
        "started_unix_s": fmt.cell_float(stage.get("started_unix_s")),
        "ended_unix_s": fmt.cell_float(stage.get("ended_unix_s")),
    }
    if stage.get("status") not in USABLE:
        why = f"its stage {stage.get('status')}: {stage.get('reason') or 'no reason given'}"
        return {**base, "outcome": INCOMPLETE, "why": why, "sureness": ""}
    level = {**stage, "users": users, "client_untrusted": _untrusted(stage)}
    busy_why = busy if isinstance(busy, str) and busy else None
    check = check_level(str(stage.get("quant") or ""), level, slo, busy_why)
    return {**base, "outcome": check.outcome, "why": check.why, "sureness": check.sureness}


def _users(count: int) -> str:
    return f"{count} user{'s' if count != 1 else ''}"


@dataclass(frozen=True)
class RampOutcome:
    """What a ramp's verdicts show (see the module docstring), and the sentence saying it."""

    held_users: int | None
    breaks_at_users: int | None
    undecided_from_users: int | None
    missed_users: int | None
    sentence: str


def ramp_outcome(steps: Sequence[dict[str, Any]], steps_planned: int | None) -> RampOutcome:
    """What the steps (in order) show: 'the SLO first breaks at N users', 'held up to N users' or
    'undecided from N users: ...', never a hold or a break a step that is not decided shows."""
    if not steps:
        return RampOutcome(None, None, None, None, "no step of the ramp was measured")
    held: int | None = None
    for step in steps:
        if step["outcome"] != "meets":
            break
        held = int(step["users"])
    miss = next((s for s in steps if s["outcome"] == "misses"), None)
    before_miss = steps[: steps.index(miss)] if miss is not None else list(steps)
    open_step = next((s for s in before_miss if s["outcome"] != "meets"), None)
    held_text = f"held up to {_users(held)}" if held is not None else ""
    if miss is not None and open_step is None:
        breaks = int(miss["users"])
        after = f"; it {held_text}" if held is not None else "; it missed from the first step"
        sentence = f"The SLO first breaks at {_users(breaks)}: {miss['why']}{after}."
        return RampOutcome(held, breaks, None, breaks, sentence)
    if open_step is not None:
        undecided = int(open_step["users"])
        head = f"The SLO {held_text}; undecided" if held is not None else "Undecided"
        sentence = f"{head} from {_users(undecided)}: {open_step['why']}"
        missed = int(miss["users"]) if miss is not None else None
        if miss is not None and missed is not None:
            at = _users(missed)
            sentence += f"; it breaks at {at} at the latest, where it misses: {miss['why']}"
        return RampOutcome(held, None, undecided, missed, sentence + ".")
    last = steps[-1]
    number = int(last["step"])
    reached = steps_planned is not None and number >= steps_planned
    end = "the last step (ramp_up.max_users)" if reached else "where the ramp ended before its last step"
    return RampOutcome(held, None, None, None, f"The SLO {held_text}: {end}; no step missed.")


def _invocation_of(stage_id: str) -> str:
    return stage_id.rsplit("-", 1)[0]


def ramp_runs(stages: pd.DataFrame, slo: Slo, quant_order: Sequence[str] = ()) -> tuple[RampRun, ...]:
    """Every ramp of the run (see the module docstring), in the run's quantization order."""
    if stages.empty or "experiment" not in stages:
        return ()
    mine = stages[stages["experiment"] == NAME]
    runs = []
    for invocation in dict.fromkeys(_invocation_of(str(s)) for s in mine["stage_id"]):
        chosen = mine[mine["stage_id"].astype(str).map(_invocation_of) == invocation].to_dict("records")
        rows = sorted((step_row(stage, slo) for stage in chosen), key=lambda row: int(row["step"]))
        planned = next((_step_of(stage.get("phase"))[1] for stage in chosen), None)
        outcome = ramp_outcome(rows, planned)
        first = chosen[0]
        runs.append(
            RampRun(
                server=str(first.get("server") or ""),
                quant=str(first.get("quant") or ""),
                invocation=invocation,
                steps=pd.DataFrame(rows, columns=list(STEP_COLUMNS)),
                steps_planned=planned,
                held_users=outcome.held_users,
                breaks_at_users=outcome.breaks_at_users,
                undecided_from_users=outcome.undecided_from_users,
                missed_users=outcome.missed_users,
                sentence=outcome.sentence,
            )
        )
    order = {quant: index for index, quant in enumerate(quant_order)}
    return tuple(sorted(runs, key=lambda run: order.get(run.quant, len(order))))
