"""Multi-turn conversations: `sessions.users` in flight at once, one stage per cache mode, repeated.

Every turn sends the whole history with the server's actual replies; records carry the session
id and turn, and each reply's `timings.cache_n` says how much of that history the server found in
its cache. Each stage has conversations of its own, so the cache-on stage cannot reuse what an
earlier stage left in the slots.

Its folder holds all of it:

  stages    how it runs: conversations at `sessions.users` at once, a stage per cache mode
  tables    its tables: TTFT and prompt tokens by turn, each conversation's cache hit rate
  chapter   its part of the report: the Multi-turn sessions section (one figure)
  findings  what the report computes of it, and its keys of summary.json
  report    its ExperimentReport (imported only by the report step)
"""

from __future__ import annotations

from quantload.experiments.base import Experiment
from quantload.experiments.sessions.stages import NAME, missing, run

EXPERIMENT = Experiment(
    name=NAME,
    title="multi-turn sessions {quant}",
    step="sessions",
    chapter="traffic",
    summary="multi-turn conversations, cache off then on ([sessions])",
    missing=missing,
    run=run,
    report=f"{__name__}.report",  # its REPORT, loaded by the registry when the report asks
)
