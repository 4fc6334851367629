"""Successive halving over configurations, as a pure state machine (tested without a server).

  rungs    rung 0 measures every configuration with a short trial (one limit search, one repeat,
           its time cap `short_trial_s`, each of its levels sent 1/eta^k of the requests a final
           trial sends, k rungs before the last); each later rung measures the best 1/eta of the one
           before with trials eta times longer and larger; the last rung measures the `finalists`
           with the limit search's own repeats, time cap and trial size (a confirmed limit). A space
           no larger than `finalists` is one rung: every configuration confirmed (the full grid).
  score    a trial's limit (users or requests/s; None when no level held) and its goodput at
           that limit (requests/s that met the SLO), the tie-break; a trial that could not run
           (the server did not start) ranks below every measured one.
  budget   `next_trial()` is None once the trials took `budget_s`; the ranking then stands on the
           rungs reached (the winner is the best of the highest rung that has a score).

`next_trial()` says what to measure next and `record()` takes what it measured, in that order; a
resumed tune records the trials already in its state file first and goes on from there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Rung:
    """One round of trials: how many configurations it measures, and how long each trial is."""

    index: int
    size: int
    time_cap_s: float
    repeats: int
    final: bool
    requests_frac: float = 1.0  # the share of a final trial's requests each of its levels sends


def plan_rungs(
    count: int, eta: int, finalists: int, short_trial_s: float, final_cap_s: float, confirm_repeats: int
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
            repeats=confirm_repeats if index == last else 1,
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
    limit: float | None
    goodput_rps: float | None
    confirmed: bool = False
    seconds: float = 0.0
    ran: bool = True  # False: the trial could not run (its server did not start)
    why: str = ""

    def order(self) -> tuple[float, float]:
        """Higher is better: the limit, then goodput; a trial that did not run is last."""
        if not self.ran:
            return (-2.0, 0.0)
        return (self.limit if self.limit is not None else -1.0, self.goodput_rps or 0.0)


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
        return [score.key for score in self._ranked(scored)[: self.rungs[index].size]]

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

    def record(self, score: Score) -> None:
        """Take the measurement of the trial `next_trial()` asked for."""
        planned = self.next_trial() if not self.out_of_budget else None
        if planned is not None and (planned.key, planned.rung.index) != (score.key, score.rung):
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
        first, then the limit and goodput measured there."""
        best: dict[str, Score] = {}
        for score in self.scores:
            if score.key not in best or score.rung >= best[score.key].rung:
                best[score.key] = score
        position = {key: n for n, key in enumerate(self.keys)}
        return sorted(best.values(), key=lambda s: (-s.rung, -s.order()[0], -s.order()[1], position[s.key]))

    def winner(self) -> Score | None:
        """The best configuration measured (None when no trial ran or none held the SLO)."""
        ranked = [score for score in self.ranking() if score.ran and score.limit is not None]
        return ranked[0] if ranked else None
