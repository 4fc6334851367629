"""The mixed-traffic diagnosis: decode-heavy traffic alone, then with long prompts mixed in.

Decode-heavy requests (short prompt, long output, ignore_eos) alone, then the same requests with
long prompts spread among them at `mixed.long_fraction`, at `mixed.users` closed-loop users; the
pair at each of `mixed.batch_sizes` (llama-server -b/-ub), the server running with those flags
for the pair (a variant: `ServerControl`). Where quantload did not start the server it cannot
change its flags: the pair runs once at the server's own batch size and says so.

Its folder holds all of it:

  stages    how it runs: the alone and mixed stages at each batch size
  tables    its tables: decode ITL, TPOT and TTFT alone and mixed, per batch size; the verdict
  chapter   its part of the report: the Mixed traffic section (two figures)
  findings  what the report computes of it, and its keys of summary.json
  report    its ExperimentReport (imported only by the report step)
"""

from __future__ import annotations

from quantload.experiments.base import Experiment
from quantload.experiments.mixed.stages import NAME, run

EXPERIMENT = Experiment(
    name=NAME,
    title="mixed traffic {quant}",
    step="mixed",
    chapter="traffic",
    summary="decode-heavy traffic alone and with long prompts, at each -b/-ub ([mixed])",
    missing=lambda settings: None,
    run=run,
    server_flags="optional",
    report=f"{__name__}.report",  # its REPORT, loaded by the registry when the report asks
)
