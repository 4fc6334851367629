"""What the chapters share: a chapter's definition, cell values, gap notes, cache-state lines and
the placement of a drawn figure."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from quantload.analysis import fmt
from quantload.analysis.document import Block, Bullets, Image, Paragraph, Section
from quantload.analysis.plotting import Figure

if TYPE_CHECKING:  # annotations only: an experiment's chapter uses these without the whole analysis
    from quantload.analysis.analyze import Analysis

# The figures the report drew, by key (a figure with nothing to draw is absent).
Plots = Mapping[str, Image]


@dataclass(frozen=True)
class Chapter:
    """A run of consecutive report sections about one subject, and the figures they show."""

    sections: Callable[[Analysis, Plots], tuple[Section, ...]]
    figures: tuple[Figure, ...] = ()


def shown(plots: Plots, figure: Figure) -> list[Block]:
    """The figure's image block, or nothing when it was not drawn."""
    image = plots.get(figure.key)
    return [image] if image is not None else []


value = fmt.cell_float  # a table cell as a float; the chapters' short name for it


def range_text(row: Mapping[str, Any], column: str, show: str = "duration") -> str:
    """A level-table figure as 'median (min–max)'."""
    return fmt.with_range(
        value(row.get(column)), value(row.get(f"{column}_min")), value(row.get(f"{column}_max")), show
    )


def interval_text(row: Mapping[str, Any], column: str) -> str:
    """A level's pooled percentile and its confidence interval ('325 ms [301–410]'), else its
    median of repeats with their range (a row from before intervals)."""
    interval = row.get(f"{column}_ci")
    if isinstance(interval, (tuple, list)):
        return fmt.with_interval(value(row.get(column)), interval)
    return range_text(row, column)


def gap_blocks(analysis: Analysis, *sections: str) -> list[Block]:
    """The "not measured" notes of the given gap sections."""
    lines = [gap.text() for gap in analysis.gaps if gap.section in sections]
    return [Bullets(tuple(dict.fromkeys(lines)), "warning")] if lines else []


def gap_blocks_about(analysis: Analysis, words: str) -> list[Block]:
    """The "not measured" notes whose subject mentions `words`."""
    lines = [g.text() for g in analysis.gaps if words in g.what]
    return [Bullets(tuple(lines), "warning")] if lines else []


def cache_state_block(analysis: Analysis, label: str) -> list[Block]:
    """The header's cache-state line for one part of the run."""
    for name, text in analysis.header.cache_states:
        if name == label:
            return [Paragraph(f"Cache state: {text}.", "muted")]
    return []


def not_run_section(key: str, title: str, why: str, analysis: Analysis | None = None, *gaps: str) -> Section:
    """A section whose part did not run: listed with the others that did not, with `why`, unless
    the run meant to measure it (a "not measured" note of the `gaps` sections), when it keeps its
    heading and says what went wrong."""
    found = [gap for gap in analysis.gaps if gap.section in gaps] if analysis is not None else []
    if found and all(gap.why.startswith(NOT_RUN_WORDS) for gap in found):  # its input was not given
        return Section(key, title, not_run="; ".join(dict.fromkeys(gap.why for gap in found)))
    if found and analysis is not None:
        return Section(key, title, (Paragraph(f"Not run: {why}.", "muted"), *gap_blocks(analysis, *gaps)))
    return Section(key, title, not_run=why)


# how a gap says its experiment was never meant to run here (report_input.not_run_because)
NOT_RUN_WORDS = ("not run because", "not asked for")
