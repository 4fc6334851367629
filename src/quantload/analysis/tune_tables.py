"""`quantload tune` in a run's report: every trial of tune.jsonl, and each quantization's outcome
as tune.json holds it (the ranking, the winner's command line and `.env` lines, the winner against
the configured flags, what the search cost against the full grid).

  trials   one row per trial: the quantization, the configuration, its rung (1 = the short first
           trials), the limit found, whether the search's repeats confirmed it, goodput at the
           limit, the memory the variant's server reported, the trial's seconds, why it could not
           run; the baseline (the configured flags searched as the finalists were) is a row too
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from quantload.tune.state_file import TUNE_JSON, TUNE_JSONL, read_tune

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


def tune_tables(run_dir: Path) -> TuneTables:
    lines = read_tune(run_dir / TUNE_JSONL)
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
    outcomes: dict[str, dict[str, Any]] = {}
    path = run_dir / TUNE_JSON
    if path.is_file():
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
            outcomes = dict(loaded.get("quants", {})) if isinstance(loaded, dict) else {}
        except ValueError:
            outcomes = {}
    return TuneTables(pd.DataFrame(rows, columns=list(TRIAL_COLUMNS)), outcomes, objective)


def tune_verdict(tables: TuneTables) -> str:
    """One sentence per tuned quantization: its winner against the configured flags, and the cost."""
    if tables.trials.empty:
        return "not run: no tune in this run"
    sentences = []
    for quant in dict.fromkeys(tables.trials["quant"]):
        outcome = tables.outcomes.get(str(quant))
        if outcome is None:
            sentences.append(f"{quant}: the tune did not finish (tune.jsonl has its trials so far)")
            continue
        against = outcome.get("against_baseline") or {}
        if outcome.get("winner") is None and not against.get("sentence"):
            sentences.append(f"{quant}: no configuration was shown to meet the SLO")
            continue
        said = f"{quant}: {against.get('sentence') or 'winner ' + str(outcome['winner'])}"
        sentences.append(f"{said}; {outcome['cost']['sentence']}")
    return "; ".join(sentences) + "."
