"""Findings that are one table and its one-sentence verdict (the flag experiments: batching, slots,
speculation): the shape their `Analysis.findings` entries share, how a chapter finds its own, and
their summary.json key."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import pandas as pd

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


@dataclass(frozen=True)
class TableFindings:
    """An experiment's table and its verdict; each experiment subclasses it, so its entry in
    `Analysis.findings` is told apart from the others'."""

    table: pd.DataFrame
    verdict: str


FindingsT = TypeVar("FindingsT", bound=TableFindings)


def findings_in(
    analysis: Analysis, name: str, kind: type[FindingsT], verdict_of: Callable[[pd.DataFrame], str]
) -> FindingsT:
    """The findings of experiment `name` in `analysis` (empty ones, with the verdict of an empty
    table, where it holds none)."""
    found = analysis.findings.get(name)
    if isinstance(found, kind):
        return found
    empty = pd.DataFrame()
    return kind(empty, verdict_of(empty))


def table_summary(name: str, found: TableFindings) -> Mapping[str, Any]:
    """Its key of summary.json, named as before the experiment had a folder of its own: `name` with
    the table's rows and the verdict (the report makes them JSON-safe)."""
    rows = found.table.to_dict("records") if not found.table.empty else []
    return {name: {"rows": rows, "verdict": found.verdict}}
