"""The report's chapters, in reading order: each a run of consecutive sections about one subject,
with the figures it shows (see `parts.Chapter`). The chapters of experiments with a part of their
own in the report (experiments.base.ExperimentReport) come right before the chapter their part
names (`before`), or follow the contexts chapter when it names none, in the registry's order.

  verdict      Run and verdict; the table, one row per quantization
  load         latency and throughput under load (3 figures); capacity under the SLO; the limit
               search (1 figure); open loop
  plan         the capacity plan (servers, memory, cost, request limits); the context a slot
               needs; when to add a server
  (the experiments' own chapters placed before traffic)
               sessions: multi-turn sessions (1 figure)
               mixed: mixed traffic (2 figures)
  traffic      trace replay; asked and delivered lengths; which TTFT a reasoning model gets
  server_flags continuous against static batching, slots at a fixed KV budget, speculative
               decoding, the tuned flags (1 figure each)
  contexts     conversations beyond the slot context: refused, trimmed, shifted (1 figure)
  (the experiments' own chapters placed after contexts)
               noisy_neighbour: tenants sharing a server; the noisy neighbour (1 figure)
               soak: one load held for long: latency, memory and KV over time (1 figure), drift
               per hour
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
    traffic,
    ttft,
    verdict,
)
from quantload.analysis.chapters.parts import Chapter, Plots
from quantload.analysis.document import Document, gathered
from quantload.analysis.plotting import Figure
from quantload.experiments.registry import reported

# the report's own chapters by name (their module's), in reading order: the experiments' chapters
# go right before the one their part names, or after EXPERIMENTS_AFTER
BUILT_IN: tuple[tuple[str, Chapter], ...] = (
    ("verdict", verdict.CHAPTER),
    ("load", load.CHAPTER),
    ("plan", plan.CHAPTER),
    ("traffic", traffic.CHAPTER),
    ("server_flags", server_flags.CHAPTER),
    ("contexts", contexts.CHAPTER),
    ("ttft", ttft.CHAPTER),
    ("model_files", model_files.CHAPTER),
    ("checks", checks.CHAPTER),
    ("server", server.CHAPTER),
    ("appendix", appendix.CHAPTER),
)
EXPERIMENTS_AFTER = "contexts"


def chapters() -> tuple[Chapter, ...]:
    """Every chapter of the report, in reading order."""
    parts = [part for _, part in reported()]
    names = [name for name, _ in BUILT_IN]
    unknown = sorted({str(part.before) for part in parts if part.before is not None} - set(names))
    if unknown:
        raise ValueError(f"an experiment's report part goes before no chapter of the report: {unknown}")
    ordered: list[Chapter] = []
    for name, chapter in BUILT_IN:
        ordered += [part.chapter for part in parts if part.before == name]
        ordered.append(chapter)
        if name == EXPERIMENTS_AFTER:
            ordered += [part.chapter for part in parts if part.before is None]
    return tuple(ordered)


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
