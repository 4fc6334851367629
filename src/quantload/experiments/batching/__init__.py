"""Continuous against static batching: the same traffic on the server with `-cb` and with `-nocb`.

llama-server batches continuously by default: a new request joins the next server step while
others generate. With `-nocb` pending prompts are admitted only when no slot is generating
(tools/server/server-context.cpp), so a new arrival waits for every running generation to end:
static batching. The experiment restarts the server with each (a variant: `ServerControl`) and
sends both the same requests of the run's workload (`workload.kind`), the prompt cache off:

  closed   `batching.users` closed-loop users, by default the limit this run's search found for
           the server as configured (or a search of its own: quantload.experiments.at_limit)
  poisson  the same requests as Poisson arrivals at `batching.rate_frac` of the requests/s the
           continuous server completed in its closed-loop stage ("near the limit"), from a pool
           of `load.open_loop_users`; TTFT counts from each request's intended send time

Each stage line names its flags (`server_args` "-cb" or "-nocb") and its part (`phase` "closed"
or "poisson"). How long a new arrival waited behind running generations is computed by the
report from the records (quantload.experiments.batching.tables). Only `quantload run` runs it.

Its folder holds all of it:

  stages    how it runs: its variants and stages, planned and run
  tables    its table: per quantization, batching mode and part, TTFT, ITL, goodput and the wait behind
            running generations, and the verdict
  chapter   its section of the server flags chapter: continuous against static batching (one
            figure)
  findings  what the report computes of it, and its key of summary.json's `server_flags`
  report    its ExperimentReport (imported only by the report step)
"""

from __future__ import annotations

from quantload.experiments.base import Experiment
from quantload.experiments.batching.stages import NAME, run

EXPERIMENT = Experiment(
    name=NAME,
    title="batching, continuous against static {quant}",
    step="batching",
    chapter="server_flags",
    summary="the same traffic with -cb and -nocb, closed loop at the limit and Poisson near it ([batching])",
    missing=lambda settings: None,
    run=run,
    server_flags="required",
    by_default=False,
    report=f"{__name__}.report",  # its REPORT, loaded by the registry when the report asks
)
