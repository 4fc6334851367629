"""What `quantload tune` prints, from tune.json entries shaped as the tune writes them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from rich.console import Console

from quantload.cli.cmd_tune import _show
from quantload.tune.outcome import RankedRow
from quantload.tune.tune_run import QuantTune, TuneResult


def _row(rank: int, key: str, limit: float | None, **fields: Any) -> dict[str, Any]:
    row = RankedRow(
        rank=rank, key=key, rung=0, final=False, limit=limit, lowest_miss=None, dropped=False,
        goodput_rps=None, output_tok_s=None, memory_mib=300.0, kv_mib=190.0, seconds=70.0, ran=True,
        why="no level was shown to meet the SLO: undecided at 1, 2",
    )  # fmt: skip
    return {**row.to_dict(), **fields}


def _printed(summary: dict[str, Any]) -> str:
    console = Console(record=True, width=200)
    result = TuneResult(Path("run"), (QuantTune("Q4_K_M", outcome=None, summary=summary),))  # type: ignore[arg-type]
    _show(SimpleNamespace(console=console), result)
    return console.export_text()


def test_a_tune_without_a_winner_shows_its_ranking_and_why() -> None:
    summary = {
        "objective": "users",
        "ranking": [
            _row(1, "np4 b256/256 kv-f16", 4.0, lowest_miss=8.0, rung=2, final=True),
            _row(2, "np8 b256/256 kv-f16", None, ran=False, why="llama-server did not become ready"),
        ],
        "winner": None,
        "against_baseline": None,
        "cost": {"sentence": "3 trials in 4 min"},
        "notes": [],
    }
    text = _printed(summary)
    assert "np4 b256/256 kv-f16" in text and "not measured" in text
    first = next(line for line in text.splitlines() if "np4 b256/256" in line)
    assert "4" in first and "8" in first and "yes" in first  # limit, misses from, final rung
    assert "np8 b256/256 kv-f16: not measured: llama-server did not become ready" in text
    assert "Q4_K_M: no winner: no configuration was shown to meet the SLO at any level" in text
    assert "search: 3 trials in 4 min" in text
