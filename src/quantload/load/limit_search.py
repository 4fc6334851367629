"""Finding the limit: the most concurrent users (or the highest arrival rate) that holds the SLO.

The search is a pure state machine, tested without a server: `next_level()` says what to
measure next, `record()` takes what the measurement said, until `next_level()` is None.

1. Grow: one trial per level from `start`, x `growth` each time, until a trial breaks the SLO
   or `max_level` held.
2. Bisect: between the highest level that held and the lowest that broke, one trial per level,
   down to one user (closed loop) or to `resolution` of the level (open loop, e.g. 10 %; rates
   are bisected geometrically).
3. Confirm: the answer must hold in a majority of `repeats` trials (its earlier trial counts).
   A candidate that does not is broken after all, and the bisection goes on below it.
A trial that failed hard (errors, timeouts) breaks its level at once, with no repeats. A time
cap ends the search early; the result then says "capped".
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

LimitKind = Literal["users", "rate_rps"]
Ending = Literal["found", "capped", "max_level", "never_held"]


@dataclass(frozen=True)
class Trial:
    """One measurement of one level."""

    level: float
    held: bool
    hard_failure: bool = False
    seconds: float = 0.0
    why: str = ""


@dataclass(frozen=True)
class LimitResult:
    """What the search found: `limit` is the highest level that held in a majority of trials."""

    kind: LimitKind
    limit: float | None
    confirmed: bool
    ending: Ending
    lowest_broken: float | None
    trials: tuple[Trial, ...]
    seconds: float

    def sentence(self) -> str:
        """One line a person reads: the limit, how it was bounded, what it took."""
        unit = "requests/s" if self.kind != "users" else "user" if self.limit == 1 else "users"
        took = f"{len(self.trials)} trials, {self.seconds:.0f} s"
        if self.limit is None:
            if self.ending == "capped":
                return f"the time cap ended the search before any level held the SLO ({took})"
            return f"no level held the SLO, not even the first ({took})"
        shown = level_text(self.limit, self.kind)
        if self.ending == "max_level":
            return f"{shown} {unit} held the SLO, the most the search may try ({took})"
        broken = self.lowest_broken
        above = "" if broken is None else f"; {level_text(broken, self.kind)} broke it"
        if self.ending == "capped":
            sure = "held" if self.confirmed else "held once (not yet confirmed)"
            return f"{shown} {unit} {sure} when the time cap ended the search{above} ({took})"
        return f"{shown} {unit} held the SLO in a majority of trials{above} ({took})"


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
    repeats: int = 3
    time_cap_s: float = 1800.0
    trials: list[Trial] = field(default_factory=list)
    elapsed_s: float = 0.0
    _phase: Literal["grow", "bisect", "confirm", "done"] = "grow"
    _low: float | None = None  # highest level that held (one trial, or confirmed)
    _high: float | None = None  # lowest level that broke
    _confirmed: float | None = None

    def __post_init__(self) -> None:
        if self.start <= 0 or self.max_level < self.start:
            raise ValueError("the search needs 0 < start <= max_level")
        if self.growth <= 1:
            raise ValueError("growth must be above 1")
        if self.repeats < 1:
            raise ValueError("repeats must be at least 1")
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
        assert self._low is not None
        return self._low  # confirm

    def record(self, trial: Trial) -> None:
        """Take one measurement of the level `next_level()` asked for."""
        self.trials.append(trial)
        self.elapsed_s += trial.seconds
        level = trial.level
        if self._phase == "confirm":
            self._confirm_step(level)
            return
        if trial.held:
            self._low = level
            if self._phase == "grow" and level >= self.max_level:
                self._phase = "confirm"
                self._confirm_step(level)
                return
        else:
            self._high = level
            if self._low is None:  # the first level already broke
                self._phase = "done"
                return
            self._phase = "bisect"
        if self._phase == "bisect":
            assert self._low is not None and self._high is not None
            if self._close(self._low, self._high):
                self._phase = "confirm"
                self._confirm_step(self._low)

    def _confirm_step(self, level: float) -> None:
        verdict = self.verdict(level)
        if verdict == "held":
            self._confirmed = level
            self._phase = "done"
        elif verdict == "broke":
            self._high = level
            below = [t.level for t in self.trials if t.held and t.level < level]
            self._low = max(below) if below else None
            if self._low is None:
                self._phase = "done"
            elif self._close(self._low, self._high):
                self._phase = "confirm"
                self._confirm_step(self._low)
            else:
                self._phase = "bisect"

    def verdict(self, level: float) -> Literal["held", "broke", "open"]:
        """A level holds once a majority of `repeats` trials held; it breaks on a hard failure
        or once that majority is out of reach."""
        outcomes = [t for t in self.trials if math.isclose(t.level, level)]
        if any(t.hard_failure for t in outcomes):
            return "broke"
        held = sum(t.held for t in outcomes)
        majority = self.repeats // 2 + 1
        if held >= majority:
            return "held"
        if len(outcomes) - held > self.repeats - majority:
            return "broke"
        return "open"

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
            if self._confirmed is None:
                ending: Ending = "never_held"
            elif self._high is None and self._confirmed >= self.max_level:
                ending = "max_level"
            else:
                ending = "found"
        else:
            ending = "capped"
        limit = self._confirmed if self._confirmed is not None else (
            self._low if ending == "capped" else None
        )
        return LimitResult(
            kind=self.kind,
            limit=limit,
            confirmed=self._confirmed is not None,
            ending=ending,
            lowest_broken=self._high,
            trials=tuple(self.trials),
            seconds=round(self.elapsed_s, 3),
        )
