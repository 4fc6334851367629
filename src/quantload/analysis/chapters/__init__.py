"""The report's chapters, in reading order: each a run of consecutive sections about one subject,
with the figures it shows (see `parts.Chapter`). The chapters of experiments with a part of their
own in the report (experiments.base.ExperimentReport) follow the chapter each names
(`ExperimentReport.follows`), in the registry's order; those placed `within` one of the report's
chapters (the trace replay within traffic, the flag experiments within server_flags) are its
sections instead.

  verdict      Run and verdict; the table, one row per quantization
  load         latency and throughput under load (3 figures); capacity under the SLO; the limit
               search (1 figure)
  (the experiments' own chapters that follow load)
               open_loop: open loop (Poisson arrivals)
  plan         the capacity plan (servers, memory, cost, request limits); the context a slot
               needs; when to add a server
  (the experiments' own chapters that follow plan)
               sessions: multi-turn sessions (1 figure)
               mixed: mixed traffic (2 figures)
  traffic      the sections placed within it (trace: trace replay); asked and delivered
               lengths; which TTFT a reasoning model gets
  server_flags the flag experiments' sections (batching: continuous against static batching;
               slots: slots at a fixed KV budget; speculation: speculative decoding), then the
               tuned flags (1 figure each)
  (the experiments' own chapters that follow server_flags)
               context: conversations beyond the slot context: refused, trimmed, shifted (1 figure)
               noisy_neighbour: tenants sharing a server; the noisy neighbour (1 figure)
               soak: one load held for long: latency, memory and KV over time (1 figure), drift
               per hour
  ttft         where TTFT goes
  (the experiments' own chapters that follow ttft)
               prefix_cache: the prompt cache off and on
  model_files  quality loss against F16; quality, speed and the roofline (1 figure); the KV
               cache
  (the experiments' own chapters that follow model_files)
               kv_types: the KV-cache type trade-off (1 figure)
  checks       Little's law; the load generator's health
  server       the servers' side from Prometheus (1 figure) and its histogram cross-check
  appendix     every load stage; the method
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from quantload.analysis.analyze import Analysis
from quantload.analysis.chapters import (
    appendix,
    checks,
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

# the report's own chapters by name, in reading order: the names experiments' chapters follow (the
# traffic and server flags chapters, None here, are made by their `chapter()` from the sections
# placed within them, then their own: WITHIN)
CHAPTERS: tuple[tuple[str, Chapter | None], ...] = (
    ("verdict", verdict.CHAPTER),
    ("load", load.CHAPTER),
    ("plan", plan.CHAPTER),
    (traffic.KEY, None),
    (server_flags.KEY, None),
    ("ttft", ttft.CHAPTER),
    ("model_files", model_files.CHAPTER),
    ("checks", checks.CHAPTER),
    ("server", server.CHAPTER),
    ("appendix", appendix.CHAPTER),
)


# the report's chapters that show the sections of the report parts placed `within` them, by name
WITHIN: dict[str, Callable[[Sequence[Chapter]], Chapter]] = {
    traffic.KEY: traffic.chapter,
    server_flags.KEY: server_flags.chapter,
}


def chapters() -> tuple[Chapter, ...]:
    """Every chapter of the report, in reading order: each experiment's own after the one it
    follows; the sections of those placed within traffic or server_flags in that chapter.
    ValueError for an experiment that follows no chapter of the report, or is placed within one
    that takes none."""
    parts = reported()
    names = {name for name, _ in CHAPTERS}
    for experiment, part in parts:
        if part.within is None and part.follows not in names:
            raise ValueError(f"{experiment.name}'s chapter follows {part.follows!r}: no such chapter")
        if part.within is not None and part.within not in WITHIN:
            raise ValueError(f"{experiment.name}'s sections go within {part.within!r}: no such chapter")
    made = {key: make([p.chapter for _, p in parts if p.within == key]) for key, make in WITHIN.items()}
    every: list[Chapter] = []
    for name, chapter in CHAPTERS:
        every.append(made[name] if chapter is None else chapter)
        every += [part.chapter for _, part in parts if part.within is None and part.follows == name]
    return tuple(every)


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
