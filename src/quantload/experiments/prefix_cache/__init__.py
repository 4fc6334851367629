"""The prompt-cache experiment: a shared system prompt on every request, cache_prompt off, then on.

A system prompt of `load.prefix_tokens` (sized with the server's /tokenize) precedes user turns
that are the prompt set's prompts of at most 256 tokens (all of them if none is that short),
cycled to `load.prefix_requests` per stage, at `load.prefix_users`. Before it starts every slot
is erased where the server allows it (`POST /slots/{id}?action=erase`, needs --slot-save-path).
The states measured do not depend on that: "off" sends cache_prompt=false (every prompt token is
computed), "on" is measured after warm-up requests (one per user) put the prefix in the slots.
Every stage line states the server state it ran in. Repeated `load.repeats` times.

Its folder holds all of it:

  stages    how it runs: the off and on stages, the pair repeated
  tables    its table: per quantization, TTFT off against on (CacheComparison)
  chapter   its part of the report: the prompt cache off and on, the ttft chapter's last section
  findings  what the report computes of it, its key of summary.json (`prompt_cache`), and its
            note of each model file it did not measure
  report    its ExperimentReport (imported only by the report step)
"""

from __future__ import annotations

from quantload.experiments.base import Experiment
from quantload.experiments.prefix_cache.stages import NAME, missing, run

EXPERIMENT = Experiment(
    name=NAME,
    title="prompt cache {quant}",
    step="prefix_cache",
    chapter="ttft",
    summary="a shared system prompt, cache_prompt off then on",
    missing=missing,
    run=run,
    report=f"{__name__}.report",  # its REPORT, loaded by the registry when the report asks
)
