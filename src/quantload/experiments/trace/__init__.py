"""Trace replay: `trace.path` sent open loop at `trace.speed` (its first `trace.max_requests`).

Each request keeps the trace's input and output lengths (synthetic prompts of that length) and
is sent at its arrival time divided by the speed; latency counts from that intended time
(quantload.slo: the stage's arrival process is "trace"), so a client that lagged shows it.

Its folder holds all of it:

  stages    how it runs: the one open-loop stage at the trace's own times
  chapter   its part of the report: the trace replay, the traffic chapter's first section (placed
            within that chapter, before the lengths and reasoning sections)
  findings  what the report computes of it: its stages' rows of the stage table (no key of
            summary.json: those rows are in its `stages`)
  report    its ExperimentReport (imported only by the report step)
"""

from __future__ import annotations

from quantload.experiments.base import Experiment
from quantload.experiments.trace.stages import NAME, missing, run

EXPERIMENT = Experiment(
    name=NAME,
    title="trace replay {quant}",
    step="trace",
    chapter="traffic",
    summary="trace.path replayed open loop at trace.speed (needs trace.path)",
    missing=missing,
    run=run,
    report=f"{__name__}.report",  # its REPORT, loaded by the registry when the report asks
)
