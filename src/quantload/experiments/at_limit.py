"""The load "at the limit" an experiment compares server flags at: the users the run's own limit
search found for this server, or a search of its own when the run has none.

The experiments that vary batching or speculation measure at the most users the server as
configured holds within the SLO. Where this run's `limit_users` search of the same server has
already found it (limits.jsonl, the server as configured), that is the level; otherwise the
experiment searches it itself on the server as it stands, and files the search under its own
variant name (so the capacity verdict, which is about the run's own search, leaves it out). Where
no level held the SLO, the level is one user.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from quantload.experiments.base import ExperimentContext, ExperimentRun, experiment_run
from quantload.experiments.limit_trials import run_limit_search
from quantload.load.limit_file import LimitLine
from quantload.load.summary import StageSummary


@dataclass(frozen=True)
class AtLimit:
    """The users to measure at, where that figure comes from, and the stages a search ran."""

    users: int
    source: str
    summaries: tuple[StageSummary, ...] = ()  # the trials of a search of its own (they may fail)

    def with_search_time(self, run: ExperimentRun) -> ExperimentRun:
        """`run` with the search's time added to its busy time (its trials, which may fail on
        purpose, are not the experiment's stages)."""
        searched = experiment_run(run.experiment, self.summaries).busy_s
        return dataclasses.replace(run, busy_s=run.busy_s + searched)


def found_users(context: ExperimentContext) -> LimitLine | None:
    """This run's latest `limit_users` search of the target's server as configured, if any."""
    lines = [
        line
        for line in context.run.run_dir.limits()
        if line.experiment == "limit_users" and line.server == context.target.name and line.variant is None
    ]
    return lines[-1] if lines else None


def users_at_limit(context: ExperimentContext, asked: int, experiment: str) -> AtLimit:
    """`asked` users when set (not 0); else the run's found limit; else a search of our own (at
    least one user even when no level held)."""
    if asked > 0:
        return AtLimit(asked, f"{asked} users as set ({experiment}.users)")
    line = found_users(context)
    if line is not None:
        if line.limit is None:
            return AtLimit(1, f"1 user: this run's search found no level within the SLO ({line.sentence})")
        return AtLimit(int(line.limit), f"the limit this run's search found ({line.sentence})")
    outcome = run_limit_search("limit_users", context, variant=f"{experiment}: limit as configured")
    found = outcome.result.limit
    users = max(1, int(found)) if found is not None else 1
    why = outcome.line.sentence if found is not None else f"no level held ({outcome.line.sentence}): 1 user"
    return AtLimit(users, f"its own limit search: {why}", outcome.summaries)
