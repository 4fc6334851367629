"""The open loop: Poisson arrivals at each of `load.rates_rps`, served by a pool of users.

One stage per rate, `load.open_loop_requests` of `workload.kind`'s requests each, sent at seeded
exponential gaps by a pool of `load.open_loop_users`; latency counts from the intended send time
(quantload.slo), so a client that falls behind cannot hide the queueing.

Its folder holds all of it:

  stages    how it runs: one stage per rate
  chapter   its part of the report: the open-loop levels, the load chapter's last section
  findings  what the report computes of it (its levels, stage_tables.level_table by rate) and its
            key of summary.json (`open_loop_levels`)
  report    its ExperimentReport (imported only by the report step)
"""

from __future__ import annotations

from quantload.experiments.base import Experiment
from quantload.experiments.open_loop.stages import NAME, missing, run

EXPERIMENT = Experiment(
    name=NAME,
    title="open loop {quant}",
    step="open_loop",
    chapter="load",
    summary="Poisson arrivals at each of load.rates_rps (needs them)",
    missing=missing,
    run=run,
    report=f"{__name__}.report",  # its REPORT, loaded by the registry when the report asks
)
