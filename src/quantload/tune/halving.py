"""Successive halving over configurations, as a pure state machine (tested without a server).

  rungs    rung 0 measures every configuration with a short trial (one limit search, its time cap
           `short_trial_s`, each of its levels planned with 1/eta^k of the requests a final trial
           plans, k rungs before the last, and given the level seconds of [slo] to be decided, so a
           short trial reaches fewer levels, never levels too small to decide); each later
           rung measures the best 1/eta of the one before with trials eta times longer and larger;
           the last rung measures the `finalists` as the limit search measures (its own time cap,
           trial size and the level budget of [slo]). A space no larger than `finalists` is one rung.
  score    a trial's limit range: the highest level shown to meet the SLO (None: none) and the
           lowest shown to miss it (quantload.comparison.LimitRange), with goodput at the limit
           (requests/s that met the SLO); a trial that could not run (the server did not start)
           ranks below every measured one.
  promote  a configuration another one of its rung beats (met the SLO at a level it was shown to
           miss) is dropped; of the rest, the best by limit and goodput go on, at most the next
           rung's size. Nothing is dropped on a difference the data do not show.
  budget   `next_trial()` is None once the trials took `budget_s`; the ranking then stands on the
           rungs reached. A trial whose time cap the budget shortened (`cut_short`) and whose search
           the cap ended shows less than its rung measures: it stands for its configuration only
           where it ranks above what that configuration's rung before showed.

`next_trial()` says what to measure next and `record()` takes what it measured, in that order; a
resumed tune records the trials already in its state file first and goes on from there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from quantload.comparison import LimitRange


@dataclass(frozen=True)
class Rung:
    """One round of trials: how many configurations it measures, and how long each trial is."""

    index: int
    size: int
    time_cap_s: float
    final: bool
    requests_frac: float = 1.0  # the share of the requests a final trial plans a level


def plan_rungs(
    count: int, eta: int, finalists: int, short_trial_s: float, final_cap_s: float
) -> tuple[Rung, ...]:
    """The rungs for `count` configurations (see the module docstring)."""
    if count < 1 or eta < 2 or finalists < 1:
        raise ValueError("successive halving needs configurations, eta >= 2 and a finalist")
    sizes = [count]
    while sizes[-1] > finalists:
        sizes.append(max(finalists, math.ceil(sizes[-1] / eta)))
    last = len(sizes) - 1
    return tuple(
        Rung(
            index=index,
            size=size,
            time_cap_s=final_cap_s if index == last else min(final_cap_s, short_trial_s * eta**index),
            final=index == last,
            requests_frac=1.0 / eta ** (last - index),
        )
        for index, size in enumerate(sizes)
    )


@dataclass(frozen=True)
class Score:
    """What one trial measured of one configuration at one rung."""

    key: str
    rung: int
    limit: float | None  # the highest level shown to meet the SLO
    goodput_rps: float | None
    lowest_miss: float | None = None  # the lowest level shown to miss it
    seconds: float = 0.0
    ran: bool = True  # False: the trial could not run (its server did not start)
    why: str = ""
    whole: bool = True  # levels are whole users
    cut_short: bool = False  # the budget shortened its time cap and the cap ended its search

    def order(self) -> tuple[float, float]:
        """Higher is better: the limit, then goodput; a trial that did not run is last."""
        if not self.ran:
            return (-2.0, 0.0)
        return (self.limit if self.limit is not None else -1.0, self.goodput_rps or 0.0)

    def limit_range(self) -> LimitRange:
        return LimitRange(self.limit, self.lowest_miss, self.whole)

    def beats(self, other: Score) -> bool:
        """Shown to meet the SLO at a level `other` was shown to miss (or `other` did not run)."""
        if not self.ran:
            return False
        if not other.ran:
            return True
        return self.limit is not None and other.lowest_miss is not None and self.limit >= other.lowest_miss


@dataclass(frozen=True)
class PlannedTrial:
    """The next trial to run."""

    key: str
    rung: Rung


@dataclass
class SuccessiveHalving:
    """The search's state; see the module docstring."""

    keys: tuple[str, ...]
    rungs: tuple[Rung, ...]
    budget_s: float
    scores: list[Score] = field(default_factory=list)
    elapsed_s: float = 0.0

    def __post_init__(self) -> None:
        if len(set(self.keys)) != len(self.keys):
            raise ValueError("configuration keys must be distinct")
        if not self.rungs or self.rungs[0].size != len(self.keys):
            raise ValueError("rung 0 must measure every configuration")

    @property
    def planned_trials(self) -> int:
        return sum(rung.size for rung in self.rungs)

    @property
    def out_of_budget(self) -> bool:
        return self.elapsed_s >= self.budget_s

    def rung_scores(self, index: int) -> list[Score]:
        return [score for score in self.scores if score.rung == index]

    def _ranked(self, scores: Sequence[Score]) -> list[Score]:
        position = {key: n for n, key in enumerate(self.keys)}
        return sorted(scores, key=lambda s: (-s.order()[0], -s.order()[1], position[s.key]))

    def entrants(self, index: int) -> list[str] | None:
        """The configurations rung `index` measures; None while the rung before is unfinished."""
        if index == 0:
            return list(self.keys)
        before = self.entrants(index - 1)
        scored = self.rung_scores(index - 1)
        if before is None or {s.key for s in scored} != set(before):
            return None
        unbeaten = [s for s in scored if not any(other.beats(s) for other in scored if other is not s)]
        return [score.key for score in self._ranked(unbeaten)[: self.rungs[index].size]]

    def dropped(self, index: int) -> list[str]:
        """The configurations of rung `index` that another of the rung beat."""
        scored = self.rung_scores(index)
        return [s.key for s in scored if any(other.beats(s) for other in scored if other is not s)]

    def next_trial(self) -> PlannedTrial | None:
        """The next configuration to measure and at which rung; None when done or out of time."""
        if self.out_of_budget:
            return None
        for rung in self.rungs:
            entrants = self.entrants(rung.index)
            if entrants is None:
                return None
            done = {score.key for score in self.rung_scores(rung.index)}
            for key in entrants:
                if key not in done:
                    return PlannedTrial(key, rung)
        return None

    def accepts(self, key: str, rung: int) -> bool:
        """Whether a trial of `key` at `rung` is one the search plans now: an entrant of a rung whose
        entrants are decided, not measured yet (a resumed tune's lines may come in another order)."""
        if self.out_of_budget or not 0 <= rung < len(self.rungs):
            return False
        entrants = self.entrants(rung)
        done = {score.key for score in self.rung_scores(rung)}
        return entrants is not None and key in entrants and key not in done

    def record(self, score: Score) -> None:
        """Take the measurement of a trial the search plans now (`next_trial()`, or any that
        `accepts`)."""
        planned = self.next_trial() if not self.out_of_budget else None
        if planned is not None and not self.accepts(score.key, score.rung):
            raise ValueError(
                f"expected a trial of {planned.key!r} at rung {planned.rung.index},"
                f" got {score.key!r} at rung {score.rung}"
            )
        self.scores.append(score)
        self.elapsed_s += score.seconds

    @property
    def finished(self) -> bool:
        """Every planned trial ran (not ended by the budget)."""
        return len(self.scores) == self.planned_trials

    def ranking(self) -> list[Score]:
        """One score per configuration, its highest rung's, best first: the highest rung reached
        first, then the limit and goodput measured there. A trial cut short by the budget replaces
        its configuration's score from the rung before only where it ranks above it."""
        best: dict[str, Score] = {}
        for score in sorted(self.scores, key=lambda s: s.rung):
            kept = best.get(score.key)
            if kept is None or not score.cut_short or score.order() > kept.order():
                best[score.key] = score
        position = {key: n for n, key in enumerate(self.keys)}
        return sorted(best.values(), key=lambda s: (-s.rung, -s.order()[0], -s.order()[1], position[s.key]))

    def winner(self) -> Score | None:
        """The best configuration measured (None when no trial ran or none met the SLO at any level)."""
        ranked = [score for score in self.ranking() if score.ran and score.limit is not None]
        return ranked[0] if ranked else None

    def tied_with(self, best: Score) -> list[Score]:
        """The configurations measured at `best`'s rung that neither beats nor is beaten by it."""
        return [
            s
            for s in self.rung_scores(best.rung)
            if s.key != best.key and s.ran and not best.beats(s) and not s.beats(best)
        ]
