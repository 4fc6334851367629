"""The scale-out signal: which server metric showed each quantization's limit coming, and when.

From Prometheus (the exporter's series over the load phase) and the stages: for every load level
of a quantization's concurrency sweep, the most requests llama-server deferred (waiting for a
free slot) and the mean share of busy slots while that level ran, beside whether the level held
the SLO. A signal "leads" when it fired at a level that still held the SLO, "coincides" when it
fired first where the SLO broke, and is "silent" when it never fired before the break (the limit
then came from time, not from a queue: on a small machine, prefill time alone breaks TTFT before
any slot is missing). The thresholds are those of prometheus/rules/quantload.alerts.yml.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.capacity import CapacityVerdict

DEFERRED_THRESHOLD = 0.0  # any request deferred: LlamaServerQueueing
BUSY_THRESHOLD = 0.9  # share of slots busy: LlamaServerSlotsSaturated
Timing = Literal["leads", "coincides", "silent", "no break"]


@dataclass(frozen=True)
class LevelSignals:
    """What the servers showed while one sweep level ran."""

    users: int
    deferred_max: float | None
    busy_ratio_mean: float | None
    meets_slo: bool | None  # None: the level was not decided


@dataclass(frozen=True)
class SignalVerdict:
    """One quantization: the level the SLO broke at, and when each signal first fired."""

    quant: str
    levels: tuple[LevelSignals, ...]
    broke_at_users: int | None
    deferred_from_users: int | None
    busy_from_users: int | None

    def timing(self, fired_at: int | None) -> Timing:
        """How a signal that first fired at `fired_at` users relates to the break."""
        if self.broke_at_users is None:
            return "no break"
        if fired_at is None or fired_at > self.broke_at_users:
            return "silent"
        return "leads" if fired_at < self.broke_at_users else "coincides"

    def sentence(self) -> str:
        """What showed the limit coming, in one sentence."""
        busy = f"busy slots ≥ {fmt.percent(BUSY_THRESHOLD, 0)}"
        if not self.levels:
            return f"{self.quant}: no server series for its sweep levels."
        if self.broke_at_users is None:
            return f"{self.quant}: the SLO held at every level tested, so no signal can be judged yet."
        parts = []
        for name, fired in (("requests deferred", self.deferred_from_users), (busy, self.busy_from_users)):
            timing = self.timing(fired)
            if timing == "leads":
                parts.append(f"{name} from {fired} users, before the break (the signal to scale out on)")
            elif timing == "coincides":
                parts.append(f"{name} first at {fired} users, where it broke")
            else:
                parts.append(f"{name} never before the break")
        lead = "; ".join(parts)
        silent = all(self.timing(f) == "silent" for f in (self.deferred_from_users, self.busy_from_users))
        tail = (
            ": the limit came from time, not from a queue, so scale out on TTFT p99 itself"
            " (LlamaServerTTFTOverSLO)"
            if silent
            else ""
        )
        users = "user" if self.broke_at_users == 1 else "users"
        return f"{self.quant}: the SLO broke at {self.broke_at_users} {users}; {lead}{tail}."

    def to_dict(self) -> dict[str, Any]:
        """The levels, the break, when each signal fired and the sentence (summary.json)."""
        return {
            **asdict(self),
            "deferred_timing": self.timing(self.deferred_from_users),
            "busy_timing": self.timing(self.busy_from_users),
            "lead_alert": self.lead_signal(),
            "sentence": self.sentence(),
        }

    def lead_signal(self) -> str | None:
        """The alert that fires first before or at the break, if any."""
        timed = [
            (fired, alert)
            for fired, alert in (
                (self.deferred_from_users, "LlamaServerQueueing"),
                (self.busy_from_users, "LlamaServerSlotsSaturated"),
            )
            if self.timing(fired) in ("leads", "coincides") and fired is not None
        ]
        return min(timed)[1] if timed else None


def _windows(stages: pd.DataFrame, quant: str, users: int) -> list[tuple[float, float]]:
    chosen = stages[
        (stages["quant"] == quant) & (stages["experiment"] == "sweep") & (stages["users"] == users)
    ]
    return [
        (float(s.started_unix_s), float(s.ended_unix_s))
        for s in chosen.itertuples()
        if pd.notna(s.started_unix_s) and pd.notna(s.ended_unix_s)
    ]


def _within(
    series: pd.DataFrame, metric: str, quant: str, windows: Sequence[tuple[float, float]]
) -> pd.Series:
    rows = series[(series["metric"] == metric) & (series["quant"] == quant)]
    if rows.empty or not windows:
        return pd.Series(dtype=float)
    inside = pd.Series(False, index=rows.index)
    for start, end in windows:
        inside |= (rows["unix_s"] >= start) & (rows["unix_s"] <= end)
    return rows.loc[inside, "value"].astype(float)


def level_signals(
    series: pd.DataFrame, stages: pd.DataFrame, verdict: CapacityVerdict
) -> tuple[LevelSignals, ...]:
    """The signals at each of a quantization's sweep levels."""
    found = []
    for check in verdict.checks:
        windows = _windows(stages, verdict.quant, check.users)
        deferred = _within(series, "requests_deferred", verdict.quant, windows)
        busy = _within(series, "slots_busy", verdict.quant, windows)
        slots = _within(series, "slots", verdict.quant, windows)
        ratio = None
        if not busy.empty and not slots.empty and float(slots.max()) > 0:
            ratio = float(busy.mean()) / float(slots.max())
        found.append(
            LevelSignals(
                check.users,
                float(deferred.max()) if not deferred.empty else None,
                ratio,
                {"meets": True, "misses": False}.get(check.outcome),  # undecided: neither
            )
        )
    return tuple(found)


def scale_out_signals(
    series: pd.DataFrame, stages: pd.DataFrame, verdicts: Sequence[CapacityVerdict]
) -> tuple[SignalVerdict, ...]:
    """One verdict per quantization (none without server series)."""
    if series.empty or stages.empty:
        return ()
    verdicts_out = []
    for verdict in verdicts:
        levels = tuple(s for s in level_signals(series, stages, verdict) if s.busy_ratio_mean is not None)
        broke = next((s.users for s in levels if s.meets_slo is False), None)
        deferred = next((s.users for s in levels if (s.deferred_max or 0.0) > DEFERRED_THRESHOLD), None)
        busy = next((s.users for s in levels if (s.busy_ratio_mean or 0.0) >= BUSY_THRESHOLD), None)
        verdicts_out.append(SignalVerdict(verdict.quant, levels, broke, deferred, busy))
    return tuple(verdicts_out)
