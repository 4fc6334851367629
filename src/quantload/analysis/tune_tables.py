"""`quantload tune` in a run's report: every trial of tune.jsonl, and each quantization's outcome
as tune.json holds it (the ranking, the winner's command line and `.env` lines, the winner against
the configured flags, what the search cost against the full grid).

  trials   one row per trial: the quantization, the configuration, its rung (1 = the short first
           trials), the limit found, whether the search's repeats confirmed it, goodput at the
           limit, the memory the variant's server reported, the trial's seconds, why it could not
           run; the baseline (the configured flags searched as the finalists were) is a row too
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from quantload import json_input
from quantload.rundir import TUNE_JSON, TUNE_JSONL
from quantload.rundir.handle import RunDir
from quantload.rundir.jsonl import BadLines
from quantload.tune.state_file import read_tune

TRIAL_COLUMNS = (
    "quant",
    "key",
    "rung",
    "limit",
    "lowest_miss",
    "goodput_rps",
    "memory_mib",
    "kv_mib",
    "seconds",
    "ran",
    "why",
    "baseline",
)


@dataclass(frozen=True)
class TuneTables:
    """The trials (TRIAL_COLUMNS) and each quantization's outcome (tune.json), empty when the run
    did not tune."""

    trials: pd.DataFrame
    outcomes: dict[str, dict[str, Any]] = field(default_factory=dict)
    objective: str | None = None
    outcome_error: str | None = None  # why tune.json could not be read (None: read, or absent)
    notes: tuple[str, ...] = ()  # the report's notes on what could not be read


def _read_outcomes(path: Path) -> tuple[dict[str, dict[str, Any]], str | None]:
    """tune.json's outcome per quantization, and why it could not be read (None: it was, or it is
    absent)."""
    if not path.is_file():
        return {}, None
    try:
        loaded = json_input.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, UnicodeDecodeError) as error:
        return {}, f"{type(error).__name__}: {str(error).splitlines()[0][:160] if str(error) else ''}"
    quants = loaded.get("quants") if isinstance(loaded, dict) else None
    if not isinstance(quants, dict) or not all(isinstance(entry, dict) for entry in quants.values()):
        return {}, "not a tune.json (no table of quantizations)"
    return dict(quants), None


def tune_tables(run_dir: Path) -> TuneTables:
    files = RunDir(run_dir)
    bad = BadLines(TUNE_JSONL)
    lines = read_tune(files.tune_state_path, bad)
    rows = [
        {
            "quant": line.quant,
            "key": line.key,
            "rung": (line.rung or 0) + 1,
            "limit": line.limit,
            "lowest_miss": line.lowest_miss,
            "goodput_rps": line.goodput_rps,
            "memory_mib": line.memory_mib,
            "kv_mib": line.kv_mib,
            "seconds": line.seconds,
            "ran": line.ran,
            "why": line.why,
            "baseline": line.kind == "baseline",
        }
        for line in lines
        if line.kind in ("trial", "baseline")
    ]
    objective = next((line.objective for line in lines if line.kind == "start"), None)
    outcomes, error = _read_outcomes(files.tune_outcome_path)
    notes = [note for note in (bad.note(),) if note is not None]
    if error is not None:
        notes.append(f"{TUNE_JSON} could not be read ({error}); the tune's outcome is left out")
    trials = pd.DataFrame(rows, columns=list(TRIAL_COLUMNS))
    return TuneTables(trials, outcomes, objective, error, tuple(notes))


def tune_verdict(tables: TuneTables) -> str:
    """One sentence per tuned quantization: its winner against the configured flags, and the cost."""
    if tables.trials.empty:
        return "not run: no tune in this run"
    sentences = []
    for quant in dict.fromkeys(tables.trials["quant"]):
        outcome = tables.outcomes.get(str(quant))
        if outcome is None and tables.outcome_error is not None:
            sentences.append(
                f"{quant}: {TUNE_JSON} could not be read ({tables.outcome_error}); tune.jsonl has its"
                " trials"
            )
            continue
        if outcome is None:
            sentences.append(f"{quant}: the tune did not finish (tune.jsonl has its trials so far)")
            continue
        against = outcome.get("against_baseline")
        against = against if isinstance(against, dict) else {}
        if outcome.get("winner") is None and not against.get("sentence"):
            sentences.append(f"{quant}: no configuration was shown to meet the SLO")
            continue
        said = f"{quant}: {against.get('sentence') or 'winner ' + str(outcome.get('winner'))}"
        cost = outcome.get("cost")
        sentences.append(f"{said}; {cost.get('sentence')}" if isinstance(cost, dict) else said)
    return "; ".join(sentences) + "."
