"""Finding the limit: the most concurrent users (or the highest arrival rate) shown to meet the SLO.

The search is a pure state machine, tested without a server: `next_level()` says what to
measure next, `record()` takes what the measurement said, until `next_level()` is None. Every
trial is decided as it goes (quantload.slo): it meets, misses, or stays undecided when its budget
ends, so one trial per level says all a level can say and no level is tried twice.

1. Grow: one trial per level from `start`, x `growth` each time, until a level does not meet
   (misses or undecided) or `max_level` met.
2. Bisect: between the highest level that met and the lowest that did not, down to one user
   (closed loop) or to `resolution` of the level (open loop; rates are bisected geometrically).
3. Probe: where the lowest level that did not meet was undecided and no level has missed yet,
   grow from it until a level misses (or `max_level`), so the answer says where misses begin.
The limit is the highest level that met with every level tried below it meeting (a capacity
rests on decided levels only); the levels between it and the first miss are the undecided ones.
A trial that failed hard (errors, timeouts) misses at once. A time cap ends the search early;
the result then says "capped".
"""

from __future__ import annotations

__all__ = ["LimitResult", "LimitSearch", "Trial", "TrialOutcome", "level_text", "level_unit"]

import math
from dataclasses import dataclass, field
from typing import Literal

LimitKind = Literal["users", "rate_rps"]
Ending = Literal["found", "capped", "max_level", "never_met"]
TrialOutcome = Literal["meets", "misses", "undecided"]


@dataclass(frozen=True)
class Trial:
    """One measurement of one level, decided or not."""

    level: float
    outcome: TrialOutcome
    hard_failure: bool = False
    seconds: float = 0.0
    why: str = ""

    @property
    def met(self) -> bool:
        return self.outcome == "meets"


@dataclass(frozen=True)
class LimitResult:
    """What the search found: `limit` is the highest level shown to meet the SLO with every level
    tried below it meeting too; `lowest_miss` the lowest level shown to miss it; `undecided` the
    levels tried that were neither."""

    kind: LimitKind
    limit: float | None
    ending: Ending
    lowest_miss: float | None
    undecided: tuple[float, ...]
    trials: tuple[Trial, ...]
    seconds: float

    def sentence(self) -> str:
        """One line a person reads: the limit, where misses begin, what is undecided, what it took."""
        took = f"{len(self.trials)} trials, {self.seconds:.0f} s"
        parts = []
        if self.limit is not None:
            shown = f"{level_text(self.limit, self.kind)} {level_unit(self.limit, self.kind)}"
            parts.append(f"{shown} met the SLO")
        if self.undecided:
            parts.append(f"undecided at {', '.join(level_text(x, self.kind) for x in self.undecided)}")
        if self.lowest_miss is not None:
            parts.append(f"misses from {level_text(self.lowest_miss, self.kind)}")
        said = "; ".join(parts) or "nothing decided"
        if self.limit is None:
            lead = (
                "the time cap ended the search before any level met the SLO"
                if self.ending == "capped"
                else "no level was shown to meet the SLO"
            )
            return f"{lead}: {said} ({took})"
        if self.ending == "max_level":
            return f"{said}, the most the search may try ({took})"
        if self.ending == "capped":
            return f"{said} when the time cap ended the search ({took})"
        return f"{said} ({took})"


def level_unit(level: float, kind: LimitKind) -> str:
    """'user', 'users' or 'requests/s'."""
    if kind != "users":
        return "requests/s"
    return "user" if level == 1 else "users"


def level_text(level: float, kind: LimitKind) -> str:
    """A level as people read it: whole users, rates to three digits."""
    return f"{int(level)}" if kind == "users" else f"{level:.3g}"


@dataclass
class LimitSearch:
    """The search's state; see the module docstring for the rules."""

    kind: LimitKind
    start: float
    max_level: float
    growth: float = 2.0
    resolution: float = 0.1
    time_cap_s: float = 1800.0
    trials: list[Trial] = field(default_factory=list)
    elapsed_s: float = 0.0
    _phase: Literal["grow", "bisect", "probe", "done"] = "grow"
    _low: float | None = None  # highest level that met, every level tried below it meeting
    _high: float | None = None  # lowest level that did not meet

    def __post_init__(self) -> None:
        if self.start <= 0 or self.max_level < self.start:
            raise ValueError("the search needs 0 < start <= max_level")
        if self.growth <= 1:
            raise ValueError("growth must be above 1")
        if self.kind == "users":
            self.start, self.max_level = float(int(self.start)), float(int(self.max_level))

    def next_level(self) -> float | None:
        """The level to measure next, or None when the search is over (done or out of time)."""
        if self._phase == "done" or self.elapsed_s >= self.time_cap_s:
            return None
        if not self.trials:
            return self.start
        if self._phase == "grow":
            assert self._low is not None
            return self._grown(self._low)
        if self._phase == "bisect":
            assert self._low is not None and self._high is not None
            return self._middle(self._low, self._high)
        return self._grown(max(t.level for t in self.trials))  # probe

    def record(self, trial: Trial) -> None:
        """Take one measurement of the level `next_level()` asked for."""
        self.trials.append(trial)
        self.elapsed_s += trial.seconds
        level = trial.level
        if self._phase == "probe":
            if trial.outcome == "misses" or level >= self.max_level:
                self._phase = "done"
            return
        if trial.met:
            self._low = level
            if self._phase == "grow" and level >= self.max_level:
                self._phase = "done"
                return
        else:
            self._high = level
            if self._low is None:  # the first level did not meet
                self._after_bisect()
                return
            self._phase = "bisect"
        if self._phase == "bisect":
            assert self._low is not None and self._high is not None
            if self._close(self._low, self._high):
                self._after_bisect()

    def _after_bisect(self) -> None:
        """Probe for the first miss when none is known yet, else done."""
        missed = any(t.outcome == "misses" for t in self.trials)
        highest = max(t.level for t in self.trials)
        self._phase = "done" if missed or highest >= self.max_level else "probe"

    def _grown(self, level: float) -> float:
        grown = level * self.growth
        if self.kind == "users":
            grown = float(max(int(grown), int(level) + 1))
        return min(grown, self.max_level)

    def _close(self, low: float, high: float) -> bool:
        if self.kind == "users":
            return high - low <= 1
        return high - low <= self.resolution * low

    def _middle(self, low: float, high: float) -> float:
        if self.kind == "users":
            return float((int(low) + int(high)) // 2)
        return math.sqrt(low * high)

    def result(self) -> LimitResult:
        """The answer so far; the final one once `next_level()` is None."""
        if self._phase == "done":
            if self._low is None:
                ending: Ending = "never_met"
            elif self._high is None and self._low >= self.max_level:
                ending = "max_level"
            else:
                ending = "found"
        else:
            ending = "capped"
        misses = [t.level for t in self.trials if t.outcome == "misses"]
        undecided = sorted({t.level for t in self.trials if t.outcome == "undecided"})
        return LimitResult(
            kind=self.kind,
            limit=self._low,
            ending=ending,
            lowest_miss=min(misses) if misses else None,
            undecided=tuple(undecided),
            trials=tuple(self.trials),
            seconds=round(self.elapsed_s, 3),
        )
