"""The noisy neighbour: tenants sharing one server while one of them steps its load up.

Every tenant of `[[tenants]]` sends its own traffic (its workload, any kind) at its own load in
the same stages; the neighbour (`noisy_neighbour.neighbour`, by default the last tenant) instead
sends at each load of `noisy_neighbour.steps` in turn: users when it is a closed-loop tenant,
requests/s when it is an open-loop one; a step of 0 leaves the others alone. One stage per step
(`noisy_neighbour.repeats` times): a closed-loop tenant gets `requests_per_user` requests per user,
an open-loop one Poisson arrivals at its rate for `step_seconds`. Within a stage each tenant keeps
its own concurrency (its users, or `rate_users` for its arrivals: the ticket book holds the rest of
its requests back), so the neighbour's load cannot take the others' users. Every record names its
tenant; the report judges each tenant against its own SLO, computes the fairness index and says at
which neighbour load the others break theirs.

llama-server has no priorities: what the experiment can show is how much one tenant's burst costs
the others on a shared server, and (in the report) what a server per tenant would cost instead.

Its folder holds all of it:

  stages    how it runs: every tenant's share of each stage, planned and run
  tables    its tables: per tenant against its own SLO, per neighbour load, the verdict
  chapter   its part of the report: the Tenants and the noisy-neighbour sections (one figure)
  findings  what the report computes of it, and its keys of summary.json
  report    its ExperimentReport (imported only by the report step)
"""

from __future__ import annotations

from quantload.experiments.base import Experiment
from quantload.experiments.noisy_neighbour.stages import NAME, missing, run

EXPERIMENT = Experiment(
    name=NAME,
    title="noisy neighbour {quant}",
    step="noisy_neighbour",
    chapter=NAME,
    summary="tenants sharing a server while one steps its load up ([[tenants]], [noisy_neighbour])",
    missing=missing,
    run=run,
    report=f"{__name__}.report",  # its REPORT, loaded by the registry when the report asks
)
