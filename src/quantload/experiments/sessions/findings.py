"""What the report computes of the sessions experiment (its `Analysis.findings` entry) and what it
adds to summary.json."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pandas as pd

from quantload.analysis.report_input import ReportInput
from quantload.experiments.sessions.stages import NAME
from quantload.experiments.sessions.tables import hit_summary, session_hits, turn_table

if TYPE_CHECKING:
    from quantload.analysis.analyze import Analysis


@dataclass(frozen=True)
class SessionsFindings:
    """The figures by turn, each conversation's hit rate, and those summarized per cache mode."""

    turns: pd.DataFrame  # tables.turn_table
    hits: pd.DataFrame  # tables.session_hits
    hit_summary: pd.DataFrame  # tables.hit_summary


def sessions_findings(given: ReportInput) -> SessionsFindings:
    """The tables of the run's complete sessions stages (empty where it has none)."""
    records = given.run.records
    hits = session_hits(records, given.stages, given.quants)
    return SessionsFindings(
        turns=turn_table(records, given.stages, given.quants), hits=hits, hit_summary=hit_summary(hits)
    )


def findings_of(analysis: Analysis) -> SessionsFindings:
    """The sessions experiment's findings in `analysis` (empty ones where it holds none)."""
    found = analysis.findings.get(NAME)
    if isinstance(found, SessionsFindings):
        return found
    return SessionsFindings(pd.DataFrame(), pd.DataFrame(), pd.DataFrame())


def summary_keys(found: SessionsFindings) -> Mapping[str, Any]:
    """Its keys of summary.json, named as before the experiment had a folder of its own:
    `session_turns` (tables.turn_table's rows) and `session_hits` (tables.hit_summary's, per cache
    mode; not one row per conversation); the report makes them JSON-safe."""
    return {
        "session_turns": found.turns.to_dict("records"),
        "session_hits": found.hit_summary.to_dict("records"),
    }
