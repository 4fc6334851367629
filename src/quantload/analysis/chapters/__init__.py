"""The report's chapters, in reading order: each a run of consecutive sections about one subject,
with the figures it shows (see `parts.Chapter`). The chapters of experiments with a part of their
own in the report (experiments.base.ExperimentReport) follow the contexts chapter, in the
registry's order; those placed `within` one of these chapters (the flag experiments, within
server_flags) are its sections instead.

  verdict      Run and verdict; the table, one row per quantization
  load         latency and throughput under load (3 figures); capacity under the SLO; the limit
               search (1 figure); open loop
  plan         the capacity plan (servers, memory, cost, request limits); the context a slot
               needs; when to add a server
  traffic      multi-turn sessions (1 figure); mixed traffic (2 figures); trace replay; asked and
               delivered lengths; which TTFT a reasoning model gets
  server_flags the flag experiments' sections (batching: continuous against static batching;
               slots: slots at a fixed KV budget; speculation: speculative decoding), then the
               tuned flags (1 figure each)
  contexts     conversations beyond the slot context: refused, trimmed, shifted (1 figure)
  (the experiments' own chapters)
               noisy_neighbour: tenants sharing a server; the noisy neighbour (1 figure)
  soak         one load held for long: latency, memory and KV over time (1 figure), drift per hour
  ttft         where TTFT goes; the prompt cache off and on
  model_files  quality loss against F16; quality, speed and the roofline (1 figure); the KV
               cache; the KV-cache type trade-off (1 figure)
  checks       Little's law; the load generator's health
  server       the servers' side from Prometheus (1 figure) and its histogram cross-check
  appendix     every load stage; the method
"""

from __future__ import annotations

from quantload.analysis.analyze import Analysis
from quantload.analysis.chapters import (
    appendix,
    checks,
    contexts,
    load,
    model_files,
    plan,
    server,
    server_flags,
    soak,
    traffic,
    ttft,
    verdict,
)
from quantload.analysis.chapters.parts import Chapter, Plots
from quantload.analysis.document import Document, gathered
from quantload.analysis.plotting import Figure
from quantload.experiments.registry import reported

BEFORE_FLAGS: tuple[Chapter, ...] = (verdict.CHAPTER, load.CHAPTER, plan.CHAPTER, traffic.CHAPTER)
AFTER_EXPERIMENTS: tuple[Chapter, ...] = (
    soak.CHAPTER,
    ttft.CHAPTER,
    model_files.CHAPTER,
    checks.CHAPTER,
    server.CHAPTER,
    appendix.CHAPTER,
)


def chapters() -> tuple[Chapter, ...]:
    """Every chapter of the report, in reading order."""
    parts = reported()
    placed = {None, server_flags.KEY}
    lost = [experiment.name for experiment, part in parts if part.within not in placed]
    if lost:  # a report part placed within a chapter the report does not have would be left out
        raise ValueError(f"no report chapter {server_flags.KEY!r} or of their own for {', '.join(lost)}")
    own = tuple(part.chapter for _, part in parts if part.within is None)
    flags = server_flags.chapter([part.chapter for _, part in parts if part.within == server_flags.KEY])
    return (*BEFORE_FLAGS, flags, contexts.CHAPTER, *own, *AFTER_EXPERIMENTS)


def figures() -> tuple[Figure, ...]:
    """Every figure of the report, in the order the chapters show them."""
    return tuple(figure for chapter in chapters() for figure in chapter.figures)


def build_document(analysis: Analysis, plots: Plots) -> Document:
    """The whole report."""
    model = analysis.header.model or "model not recorded"
    sections = tuple(section for chapter in chapters() for section in chapter.sections(analysis, plots))
    return Document(
        f"quantload report: {model}", f"run {analysis.header.run_id}", gathered(sections, before="stages")
    )
