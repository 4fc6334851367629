"""The kv_types experiment (the KV-cache type trade-off): decode speed of one model file served with
each KV-cache type.

For each type of `quality.kld_cache_types`, a llama-server of the same file whose K and V caches
are of that type (the quantization's own server for the type it serves, a variant otherwise:
`ServerControl`, flash attention on where a quantized V cache needs it) and one closed-loop stage
on it: `kv_types.users` users, `kv_types.requests` short prompts (at most
`kv_types.prompt_max_tokens` tokens), each generating `kv_types.max_tokens` tokens with ignore_eos
and cache_prompt off, so every server does the same decode work and the stages compare. Each
stage line names its cache type (`kv_cache_type`); each variant's KV cache, predicted and as the
server logged it, is filed in kv.json's `cache_types`.

It changes the server's flags, so only `quantload run` runs it. A cache type whose server cannot
be had (or whose stage cannot run) does not stop the others; the experiment raises afterwards,
naming each one that failed.

Its folder holds all of it:

  stages    how it runs: a stage per cache type, on the quantization's server or a variant
  tables    its table: per quantization and cache type, memory, decode speed and quality cost
  chapter   its part of the report: the KV-cache type trade-off section (one figure)
  findings  what the report computes of it, its keys of summary.json, and the cache types a run
            meant to serve and did not
  report    its ExperimentReport (imported only by the report step)
"""

from __future__ import annotations

from quantload.experiments.base import Experiment
from quantload.experiments.kv_types.stages import NAME, missing, run

EXPERIMENT = Experiment(
    name=NAME,
    title="KV-cache types {quant}",
    step="kv_types",
    chapter="model_files",
    summary="a decode-heavy stage per KV-cache type of quality.kld_cache_types ([kv_types])",
    missing=missing,
    run=run,
    server_flags="required",
    report=f"{__name__}.report",  # its REPORT, loaded by the registry when the report asks
)
