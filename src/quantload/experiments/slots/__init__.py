"""Slots at a fixed KV budget: the limit search at each `-np`, the context per slot shrinking so the
KV cache stays exactly the same size.

For each count of `slots.counts` the server restarts (a variant: `ServerControl`) with `-np N`
and `-c` the budget `slots.kv_cells` (default: the run's own slots x context per slot), so each
slot holds budget / N tokens. With llama.cpp's non-unified cache that is N streams of budget / N
cells, the same cells and bytes at every N (quantload.kvcache, checked against the KV line each
variant logs), as long as budget / N is a whole multiple of llama.cpp's 256-cell padding: the
check says so before any server starts. At each count the limit search for users runs
(`limit_users` with `[limit]`, on the run's workload), filed under the variant "slots -np N".
The report then says where more slots stop paying, and which requests no longer fit a slot.

Its folder holds all of it:

  stages    how it runs: a limit search on each -np variant
  tables    its table: per quantization and -np, the KV cache, the limit found, goodput and the
            requests that no longer fit a slot, and the verdict
  chapter   its section of the server flags chapter: slots at a fixed KV budget (one figure)
  findings  what the report computes of it, and its key of summary.json's `server_flags`
  report    its ExperimentReport (imported only by the report step)
"""

from __future__ import annotations

from quantload.experiments.base import Experiment
from quantload.experiments.slots.stages import NAME, check, run

EXPERIMENT = Experiment(
    name=NAME,
    title="slots at a fixed KV budget {quant}",
    step="slots",
    chapter="server_flags",
    summary="the limit search at each -np of slots.counts, the KV cache kept the same size ([slots])",
    missing=lambda settings: None,
    run=run,
    server_flags="required",
    searches=True,
    by_default=False,
    check=check,
    report=f"{__name__}.report",  # its REPORT, loaded by the registry when the report asks
)
