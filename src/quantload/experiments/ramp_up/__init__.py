"""The ramp-up: closed-loop users grown by one every `ramp_up.step_s`, until the SLO breaks.

From `ramp_up.start_users` (1) up to `ramp_up.max_users` (8), each step is a timed stage of
`ramp_up.step_s` at one user more than the one before (`StagePlan.duration_s`,
quantload.load.timed_supply): the users send `workload.kind`'s requests (one pool, as many as a
sweep stage sends and at least one per user of the last step) again and again until the step's time
is up, then those in flight finish. Each step is its own plan, judged against the run's SLO by
quantload.slo's judge as it ends (meets, misses or undecided, as every level is), and the ramp
stops after the first step that misses (or whose stage does not end ok), or after `max_users`.
Only the first step has warm-up requests. Not run unless named (`-e ramp_up`,
`load.experiments`).

Its folder holds all of it:

  stages    how it runs: its steps, planned and run one at a time, and when the ramp stops
  tables    its tables: per quantization each step's users, requests, TTFT and TPOT at the SLO's
            percentiles with their intervals, its verdict; where the SLO first breaks
  chapter   its part of the report: the Ramp-up section (one figure)
  findings  what the report computes of it, and its key of summary.json
  report    its ExperimentReport (imported only by the report step)
"""

from __future__ import annotations

from quantload.experiments.base import Experiment
from quantload.experiments.ramp_up.stages import NAME, missing, run

__all__ = ["EXPERIMENT", "NAME"]


EXPERIMENT = Experiment(
    name=NAME,
    title="ramp-up {quant}",
    step="ramp_up",
    chapter=NAME,
    summary="closed-loop users grown by one every ramp_up.step_s until a step misses the SLO ([ramp_up])",
    missing=missing,
    run=run,
    by_default=False,
    report=f"{__name__}.report",  # its REPORT, loaded by the registry when the report asks
)
