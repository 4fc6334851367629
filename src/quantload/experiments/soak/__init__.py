"""The soak: one fixed load held for `soak.duration_s`, in time slices, watching for drift.

The load is `soak.users` closed-loop users, or Poisson arrivals at `soak.rate_rps`; with
`soak.from_limit` it is the limit this run's search found for the server (limit_users, or
limit_rate for a rate) less `plan.headroom_frac`, when the run searched one before (else the set
level, and a warning says so). It sends `workload.kind`'s requests: one pool of them (the number a
sweep stage sends, at least one per user), the same in every slice.

Each slice of `soak.slice_s` (the last one what is left) is a timed stage of its own
(`StagePlan.duration_s`, quantload.load.timed_supply): the users send the pool's requests again and
again until the slice's time is up, then those in flight finish and the next slice starts (each
boundary drains, at most one request's time per user). So records, stage lines and summaries go to
disk as the soak goes, a slice's figures are let go once its summary is written, and the plan
and the load client hold one slice's worth at a time. Only the first slice has warm-up requests.

While the slices run, `SoakWatch` (watch) reads the server's resident memory and the KV cells in
use every `soak.sample_s` into soak.jsonl; every slice's stage_end line carries the load client's
own memory. The report fits the drift.

Its folder holds all of it:

  stages    how it runs: the level held, one timed stage per slice, planned and run; the
            duration parser of `--duration`
  watch     the watch on its server while it runs: memory and KV cells into soak.jsonl
  tables    its tables: every soak of the run, each slice's figures, the readings, the drifts
  chapter   its part of the report: the Soak section (one figure)
  findings  what the report computes of it, what it could not measure, its key of summary.json
  report    its ExperimentReport (imported only by the report step)
"""

from __future__ import annotations

from quantload.experiments.base import Experiment
from quantload.experiments.soak.stages import NAME, duration_text_s, missing, run

__all__ = ["EXPERIMENT", "NAME", "duration_text_s"]


EXPERIMENT = Experiment(
    name=NAME,
    title="soak {quant}",
    step="soak",
    chapter="soak",
    summary="one load held for soak.duration_s in slices: latency, errors, memory and KV over time,"
    " and their drift per hour ([soak])",
    missing=missing,
    run=run,
    report=f"{__name__}.report",  # its REPORT, loaded by the registry when the report asks
)
