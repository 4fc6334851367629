"""Speculative decoding: off, an n-gram type and a draft model, on traffic where drafting can help
and where it cannot, at one user and at the limit.

Each way of speculating is a variant of the server (`ServerControl`): `--spec-type none` (off);
the n-gram type of `speculation.ngram_type` (no draft model; `default` = `--spec-default`, which
is ngram-mod tuned); `-md speculation.draft_model --spec-type draft-simple` when a draft is given
(checked before any server starts: the file is there and has the target's vocabulary, as
llama.cpp compares them: quantload.models.vocab); and, for benchmarking, each
`speculation.synth_lengths` value as `--spec-synth-len` on the draft (or the n-gram type), which
accepts drafts at random at that mean length. `--spec-draft-n-max` is `speculation.draft_n_max`
where set.

On each variant, per traffic kind (`repeat`: prompts of the prompt set asking the model to
repeat or lightly edit that text, where drafts from the prompt can be right; `free`: the prompt
set as it is) one stage at 1 user (`speculation.requests`) and one at the limit (the users this
run's search found, or `speculation.users`), `speculation.max_tokens` each, the prompt cache off.

A variant asked to speculate that does not (its log says "failed to initialize speculative
decoding context", its `/slots` say no slot speculates, or no draft token was counted over its
requests: quantload.experiments.speculation.probe) fails, with that reason, in variants.jsonl and in its
stages' outcome; the report never shows it as speculation. The other variants still run; the
experiment fails afterwards naming each.

Its folder holds all of it:

  stages    how it runs: its variants and stages, planned and run
  probe     whether a llama-server speculates: its log, its /slots, its draft counters
            (the tune reads them too)
  tables    its table: per quantization, way of speculating, traffic and users, the decode
            speed-up against off and the acceptance, and the verdict
  chapter   its section of the server flags chapter: speculative decoding (one figure)
  findings  what the report computes of it, and its key of summary.json's `server_flags`
  report    its ExperimentReport (imported only by the report step)
"""

from __future__ import annotations

from quantload.experiments.base import Experiment
from quantload.experiments.speculation.stages import NAME, check, run

EXPERIMENT = Experiment(
    name=NAME,
    title="speculative decoding {quant}",
    step="speculation",
    chapter="server_flags",
    summary="speculation off, n-gram and a draft model at 1 user and at the limit ([speculation])",
    missing=lambda settings: None,
    run=run,
    server_flags="required",
    by_default=False,
    check=check,
    report=f"{__name__}.report",  # its REPORT, loaded by the registry when the report asks
)
