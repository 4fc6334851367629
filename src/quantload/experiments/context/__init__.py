"""The context experiment: conversations that outgrow the slot context, under three policies.

Every conversation starts with a system prompt (`context.system_prompt_tokens`) and goes on turn
after turn (`context.turns`; by default enough for the history to reach 1.5 times the slot) with
its whole history, so it outgrows the slot somewhere along the way. One closed-loop stage per
policy of `context.policies`, each with conversations of its own, at `context.users` at once, on a
llama-server whose slots hold `context.ctx_per_slot` tokens (a variant: `ServerControl`; fail
and trim share one, shift has its own; every stage's conversations and system prompt are its own,
so no policy finds another's history in the cache):

  fail   the server's default: a turn whose prompt reaches the slot's context is refused (HTTP 400
         `exceed_context_size_error`, recorded as `context_exceeded` with its two counts) and the
         conversation ends there; a reply that fills the slot stops short (`truncated`)
  trim   the client keeps the system prompt and the most recent turns that fit beside the turn's
         reply, counted with the server's tokenizer (quantload.load.history_trim); every record
         says what the trim left out (`trimmed_turns`, `trimmed_tokens`)
  shift  the server runs with `--context-shift --keep N` (N = `context.keep_tokens`, else the
         system prompt's whole length): a reply that fills the slot goes on after the server
         drops half of what follows the kept tokens (`context_shifted`); a prompt at or beyond the
         slot is still refused, as llama.cpp refuses it whatever the flag

The stages send cache_prompt (`context.cache_prompt`), and llama-server places each turn in the
slot sharing the longest prefix with it (`context.affinity = "id_slot"` pins conversation i to slot
i % slots instead), so each turn's `timings.cache_n` says how much of the history the server still
had: the report compares the hit rate before and after a
conversation's refusal, trim or shift. Refusals and the turns they cut are expected here: they do
not count towards the stage's circuit breaker.

Where quantload did not start the server, fail and trim run on the server as it is (its own slot
context, read from /props) and shift is left out (it needs a restart with other flags); a warning
says so.

Its folder holds all of it:

  stages    how it runs: each policy's stage of conversations, on the server variant it needs
  tables    its tables: per policy and turn, per conversation, per policy
  chapter   its part of the report: the section on conversations beyond the slot context (one
            figure)
  findings  what the report computes of it, its keys of summary.json, and the policies it left out
  report    its ExperimentReport (imported only by the report step)
"""

from __future__ import annotations

from quantload.experiments.base import Experiment
from quantload.experiments.context.stages import NAME, foreign, missing, run

EXPERIMENT = Experiment(
    name=NAME,
    title="conversations beyond the slot context {quant}",
    step="context",
    chapter="contexts",
    summary="conversations that outgrow the slot: refused, trimmed by the client, shifted ([context])",
    missing=missing,
    run=run,
    server_flags="optional",
    foreign=foreign,
    report=f"{__name__}.report",  # its REPORT, loaded by the registry when the report asks
)
