"""Predicted beside measured: each file's limit as predicted before the load (predict.json,
quantload.predict) against the capacity the load decided, level by level where a sweep level was
both predicted and measured, where the two part and which part of a request the model got wrong.

A measured value parts from its prediction when it exceeds both the prediction's interval at that
level (the same level simulated under the slowest plausible cost) and the point prediction by more
than PART_FRAC. TTFT is the model's queue and prefill, TPOT its decode step: the metric that parts
names the part. A measured limit below the predicted interval's low end is a finding of its own;
where the prediction also ran the limit search on its levels' verdicts (what a search with the
run's level budget can show), the low end is that search's under the slowest cost, so a limit the
budget kept from being decided is not taken for a slow server.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.capacity import CapacityVerdict
from quantload.analysis.run_data import RunData
from quantload.predict.predict_file import PredictedFile, PredictedLevel
from quantload.rundir import PREDICT_JSON
from quantload.slo import Slo

PART_FRAC = 0.25  # a measured value this far over the point prediction (and over its interval) parts
TTFT_PART = "TTFT (queue+prefill)"
TPOT_PART = "TPOT (decode)"
SLOWER_UNDER_LOAD = (
    "measured limit below the prediction: the server or the machine is slower under load than its own"
    " benchmark (contention, threads, memory)"
)


@dataclass(frozen=True)
class LevelComparison:
    """One sweep level both predicted and measured: TTFT and TPOT at the SLO's percentiles, the
    bound each must exceed to part from the prediction, and the predicted shares of a request."""

    users: int
    predicted_ttft_s: float | None
    measured_ttft_s: float | None
    ttft_bound_s: float | None
    predicted_tpot_s: float | None
    measured_tpot_s: float | None
    tpot_bound_s: float | None
    queue_share: float
    prefill_share: float
    decode_share: float

    @property
    def ttft_parts(self) -> bool:
        return _over(self.measured_ttft_s, self.ttft_bound_s)

    @property
    def tpot_parts(self) -> bool:
        return _over(self.measured_tpot_s, self.tpot_bound_s)

    def parts(self) -> list[tuple[str, float, float]]:
        """(the part, measured, predicted) of each metric that parts here, the further off first."""
        found = []
        if self.ttft_parts and self.measured_ttft_s is not None and self.predicted_ttft_s:
            found.append((TTFT_PART, self.measured_ttft_s, self.predicted_ttft_s))
        if self.tpot_parts and self.measured_tpot_s is not None and self.predicted_tpot_s:
            found.append((TPOT_PART, self.measured_tpot_s, self.predicted_tpot_s))
        return sorted(found, key=lambda item: item[1] / item[2], reverse=True)


@dataclass(frozen=True)
class PredictionCheck:
    """One quantization's prediction against its measurement, in sentences and per level."""

    quant: str
    predicted_users: float | None
    predicted_low: float | None
    predicted_high: float | None
    measured_users: float | None
    decided: bool
    sentence: str  # "Predicted before the load: ...; measured: ..."
    parting: str  # where they part (or that they do not), and which part the model got wrong
    parted_at_users: int | None
    wrong_part: str | None  # TTFT_PART or TPOT_PART (the further off) where they part
    finding: str | None  # SLOWER_UNDER_LOAD where it holds
    levels: tuple[LevelComparison, ...]
    not_predicted: str | None = None  # why there is no prediction for this file
    slo_note: str | None = None  # the prediction's SLO percentiles differ from the report's

    def to_dict(self) -> dict[str, Any]:
        """The check as summary.json holds it: each level with whether TTFT and TPOT part there."""
        levels = [{**asdict(level), "ttft_parts": level.ttft_parts, "tpot_parts": level.tpot_parts}
                  for level in self.levels]  # fmt: skip
        return {**asdict(self), "levels": levels}


def _over(measured: float | None, bound: float | None) -> bool:
    return measured is not None and bound is not None and measured > bound


def _bound(point: float | None, slow: float | None) -> float | None:
    """The most a measured value may be without parting: the slowest cost's prediction at the level,
    and at least the point prediction plus PART_FRAC."""
    if point is None:
        return None
    return max(point * (1 + PART_FRAC), slow if slow is not None else 0.0)


def _value(row: Mapping[str, Any], column: str) -> float | None:
    return fmt.cell_float(row.get(column))


def _compare(predicted: PredictedFile, measured: pd.DataFrame) -> tuple[LevelComparison, ...]:
    """The levels both predicted and measured, fewest users first."""
    slow = {int(level.level): level for level in predicted.limit.levels_low}
    by_users: dict[int, PredictedLevel] = {int(level.level): level for level in predicted.limit.levels}
    rows = []
    for row in measured.to_dict("records"):
        users = int(row["users"])
        level = by_users.get(users)
        if level is None:
            continue
        slowest = slow.get(users)
        rows.append(
            LevelComparison(
                users=users,
                predicted_ttft_s=level.ttft_s,
                measured_ttft_s=_value(row, "ttft_at_slo_s"),
                ttft_bound_s=_bound(level.ttft_s, slowest.ttft_s if slowest else None),
                predicted_tpot_s=level.tpot_s,
                measured_tpot_s=_value(row, "tpot_at_slo_s"),
                tpot_bound_s=_bound(level.tpot_s, slowest.tpot_s if slowest else None),
                queue_share=level.queue_share,
                prefill_share=level.prefill_share,
                decode_share=level.decode_share,
            )
        )
    return tuple(sorted(rows, key=lambda item: item.users))


def _users(value: float | None) -> str:
    return fmt.DASH if value is None else fmt.number(value, 0)


def _predicted_text(predicted: PredictedFile) -> str:
    limit = predicted.limit
    low, high = _users(limit.limit_low), _users(limit.limit_high)
    if limit.limit is None:
        said = f"Predicted before the load: not even 1 user meets the SLO [{low}, {high}]"
    else:
        said = f"Predicted before the load: {_users(limit.limit)} users [{low}, {high}]"
    search = limit.search
    if search is None:
        return said
    bounds = ", ".join(
        "none" if found is None or found.limit is None else _users(found.limit)
        for found in (limit.search_low, limit.search_high)
    )
    undecided = ", ".join(_users(users) for users in search.undecided)
    left = f", undecided at {undecided}" if undecided else ""
    searched = "a limit search within its level budget"
    if search.limit is None:
        return f"{said}; {searched} is predicted to show no level [{bounds}]{left}"
    return f"{said}, of which {searched} shows {_users(search.limit)} [{bounds}]{left}"


def _lowest_expected(predicted: PredictedFile) -> float | None:
    """The fewest users the load is expected to show: the predicted search's under the slowest cost
    where it was run, else the limit's interval's low end."""
    limit = predicted.limit
    if limit.search_low is not None:
        return limit.search_low.limit
    return limit.limit_low


def _measured_text(verdict: CapacityVerdict | None) -> str:
    if verdict is None:
        return "measured: nothing (no sweep or limit search of this file)"
    if verdict.decided:
        return f"measured: {_users(verdict.held_users)} (decided)"
    if verdict.first_miss_users is not None and not verdict.undecided_users:
        return "measured: no level met the SLO (decided)"
    return "measured: not decided (no level was shown to meet the SLO)"


def _parting(levels: Sequence[LevelComparison]) -> tuple[str, int | None, str | None]:
    if not levels:
        return "No sweep level was both predicted and measured.", None, None
    for level in levels:
        parts = level.parts()
        if not parts:
            continue
        part, measured, predicted = parts[0]
        shares = (
            f"queue {fmt.percent(level.queue_share, 0)}, prefill {fmt.percent(level.prefill_share, 0)},"
            f" decode {fmt.percent(level.decode_share, 0)}"
        )
        both = f" (and {parts[1][0]}, {fmt.number(parts[1][1] / parts[1][2], 1)}x)" if len(parts) > 1 else ""
        text = (
            f"They part from {fmt.counted(level.users, 'user')}: measured {part} {fmt.duration(measured)}"
            f" against {fmt.duration(predicted)} predicted ({fmt.number(measured / predicted, 1)}x,"
            f" beyond the prediction's interval and {fmt.percent(PART_FRAC, 0)}){both}; the model got"
            f" {part} wrong (it gave a request's time as {shares})."
        )
        return text, level.users, part
    users = ", ".join(str(level.users) for level in levels)
    return (
        f"Measured stays within the prediction (its interval, or {fmt.percent(PART_FRAC, 0)}) at every"
        f" level both hold ({users} users).",
        None,
        None,
    )


def _slo_note(predicted: PredictedFile, slo: Slo) -> str | None:
    used = predicted.limit.slo
    if (used.ttft_percentile, used.tpot_percentile) == (slo.ttft_percentile, slo.tpot_percentile):
        return None
    return (
        f"the prediction took TTFT at {used.ttft_percentile} and TPOT at {used.tpot_percentile}, the"
        f" report judges {slo.ttft_percentile} and {slo.tpot_percentile}: the levels are compared as they are"
    )


def _not_predicted(run: RunData, quant: str) -> str:
    return run.step_trouble("predict", quant) or run.step_why("predict", quant, PREDICT_JSON)


def prediction_checks(
    run: RunData, levels: pd.DataFrame, capacity: Sequence[CapacityVerdict], quants: Sequence[str], slo: Slo
) -> tuple[PredictionCheck, ...]:
    """Each file's prediction against its measurement; empty when the run neither predicted nor had
    a predict step (a run from before the step, or `quantload load`'s folder)."""
    stepped = run.state is not None and any(step.name == "predict" for step in run.state.steps)
    if run.predict is None and not stepped:
        return ()
    verdicts = {verdict.quant: verdict for verdict in capacity}
    found = run.predict.predictions if run.predict is not None else {}
    checks = []
    for quant in quants:
        predicted = found.get(quant)
        verdict = verdicts.get(quant)
        measured = verdict.held_users if verdict is not None and verdict.decided else None
        if predicted is None:
            why = _not_predicted(run, quant)
            decided_alone = verdict is not None and verdict.decided
            line = f"not predicted: {why}"
            nothing = (None, None, None)
            checks.append(
                PredictionCheck(quant, *nothing, measured, decided_alone, line, "", *nothing, (), why)
            )
            continue
        mine = levels[levels["quant"] == quant] if not levels.empty else levels
        compared = _compare(predicted, mine)
        parting, parted_at, part = _parting(compared)
        low = predicted.limit.limit_low
        decided = verdict is not None and verdict.decided
        expected = _lowest_expected(predicted)
        below = decided and measured is not None and expected is not None and measured < expected
        finding = SLOWER_UNDER_LOAD if below else None
        checks.append(
            PredictionCheck(
                quant=quant,
                predicted_users=predicted.limit.limit,
                predicted_low=low,
                predicted_high=predicted.limit.limit_high,
                measured_users=measured,
                decided=decided,
                sentence=f"{_predicted_text(predicted)}; {_measured_text(verdict)}",
                parting=parting,
                parted_at_users=parted_at,
                wrong_part=part,
                finding=finding,
                levels=compared,
                slo_note=_slo_note(predicted, slo),
            )
        )
    return tuple(checks)
