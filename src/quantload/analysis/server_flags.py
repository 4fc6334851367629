"""The server flags chapter's figures: batching, slots, speculation and the tune, computed in one
call from a loaded run (each in its own module)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from quantload.analysis.batching_tables import batching_table, batching_verdict
from quantload.analysis.run_data import RunData
from quantload.analysis.slots_tables import slots_table, slots_verdict
from quantload.analysis.speculation_tables import speculation_table, speculation_verdict
from quantload.analysis.tune_tables import TuneTables, tune_tables, tune_verdict
from quantload.experiments.variant_file import read_variants
from quantload.rundir import VARIANTS_JSONL
from quantload.rundir.jsonl import BadLines


@dataclass(frozen=True)
class ServerFlagTables:
    """Every table and verdict of the server flags chapter."""

    batching: pd.DataFrame  # batching_tables.batching_table
    batching_verdict: str
    slots: pd.DataFrame  # slots_tables.slots_table
    slots_verdict: str
    speculation: pd.DataFrame  # speculation_tables.speculation_table
    speculation_verdict: str
    tune: TuneTables
    tune_verdict: str
    variants_note: str | None = None  # damaged lines of variants.jsonl

    @property
    def notes(self) -> tuple[str, ...]:
        """The report's notes on what this chapter's files held that could not be read."""
        return (*((self.variants_note,) if self.variants_note else ()), *self.tune.notes)


def server_flag_tables(run: RunData, stages: pd.DataFrame, quants: Sequence[str]) -> ServerFlagTables:
    bad = BadLines(VARIANTS_JSONL)
    variants = read_variants(run.run_dir, bad)
    batching = batching_table(run.records, stages, quants)
    slots = slots_table(run.limits, variants, dict(run.summaries), run.records, quants)
    speculation = speculation_table(run.records, stages, variants, quants)
    tune = tune_tables(run.run_dir)
    return ServerFlagTables(
        batching,
        batching_verdict(batching),
        slots,
        slots_verdict(slots),
        speculation,
        speculation_verdict(speculation),
        tune,
        tune_verdict(tune),
        bad.note(),
    )
