"""tune.jsonl (schema `quantload.tune/3`): a tune's state, appended as it goes, so it resumes.

One `start` line per quantization when its search begins (the model file it tunes; the space's
key: a hash of that file, the space, the limit search, the workload and the SLO; the
configurations and the rungs), with `tune.predict_first` one `screen` line per configuration (its
predicted limit and interval, whether it is measured, and why not: quantload.tune.predicted),
one `trial` line
as each trial ends (the configuration, the rung, the limit and goodput it measured, the memory
its server reported, how long it took, why it could not run), one `baseline` line for the server's
configured flags searched as the finalists were (`tune.baseline`), and one `end` line when the
search of that quantization is over (the winner, and whether the budget ended it). A tune interrupted
mid-trial loses only that trial: `--resume` records the trial lines again and goes on.

Every line is read through one rule (quantload.rundir.jsonl): a line that does not parse, or a
trial line that lacks its configuration or rung, is counted and named by its number, never a
traceback (`read_tune` with a `BadLines` tally).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from quantload.load.records import JsonlAppender
from quantload.rundir.jsonl import BadLines, iter_jsonl
from quantload.tune.halving import Rung, Score

TUNE_SCHEMA = "quantload.tune/3"


class TuneLine(BaseModel):
    """One line of tune.jsonl (which fields a kind of line fills: see the module docstring)."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    schema_: str = Field(default=TUNE_SCHEMA, alias="schema")
    kind: Literal["start", "screen", "trial", "baseline", "end"]
    run_id: str
    quant: str
    server: str
    unix_s: float = Field(default_factory=time.time)
    # start
    space_key: str | None = None
    model: str | None = None  # the model file tuned: its source, file name and content hash
    objective: str | None = None
    configs: list[str] = Field(default_factory=list)
    rungs: list[dict[str, float | int | bool]] = Field(default_factory=list)
    budget_s: float | None = None
    # screen (tune.predict_first; key and why too)
    predicted: bool | None = None  # False: not predictable (speculation), so measured
    predicted_limit: float | None = None
    predicted_low: float | None = None
    predicted_high: float | None = None
    kept: bool | None = None  # measured; False: screened out by the prediction (why says so)
    # trial
    key: str | None = None
    rung: int | None = None
    label: str | None = None
    args: list[str] = Field(default_factory=list)
    slots: int | None = None
    ctx_per_slot: int | None = None
    cache_type: str | None = None
    limit: float | None = None  # the highest level shown to meet the SLO
    lowest_miss: float | None = None  # the lowest level shown to miss it
    undecided: list[float] = Field(default_factory=list)
    goodput_rps: float | None = None
    output_tok_s: float | None = None
    memory_mib: float | None = None  # every buffer the server's log reports
    kv_mib: float | None = None  # the KV cache predicted (quantload.kvcache; checked against the log)
    model_mib: float | None = None  # the model buffers its log reports (weights, draft included)
    buffers_mib: float | None = None  # output and compute buffers
    seconds: float = 0.0
    ran: bool = True
    why: str = ""
    cut_short: bool = False  # the budget shortened the trial's time cap and the cap ended its search
    # end
    winner: str | None = None
    ending: str | None = None  # "done" or "budget"

    def score(self) -> Score:
        """A trial (or baseline) line as the search's score."""
        assert self.kind in ("trial", "baseline") and self.key is not None and self.rung is not None
        return Score(
            self.key, self.rung, self.limit, self.goodput_rps, self.lowest_miss, self.seconds, self.ran,
            self.why, whole=self.objective != "rate", cut_short=self.cut_short,
        )  # fmt: skip

    @classmethod
    def from_json_line(cls, line: str) -> TuneLine:
        """One line, checked: a trial or baseline line names its configuration and rung."""
        parsed = cls.model_validate_json(line)
        named = parsed.key is not None and parsed.rung is not None and parsed.rung >= 0
        if parsed.kind in ("trial", "baseline") and not named:
            raise ValueError(f"a {parsed.kind} line without its configuration or rung")
        if parsed.kind == "screen" and (parsed.key is None or parsed.kept is None):
            raise ValueError("a screen line without its configuration or whether it was kept")
        return parsed


def rung_dicts(rungs: tuple[Rung, ...]) -> list[dict[str, float | int | bool]]:
    return [
        {"index": r.index, "size": r.size, "time_cap_s": r.time_cap_s, "final": r.final}
        for r in rungs
    ]


def append_tune_line(path: Path, line: TuneLine) -> None:
    appender = JsonlAppender(path)
    try:
        appender.append_line(line.model_dump_json(by_alias=True))
    finally:
        appender.close()


def read_tune(path: Path, bad: BadLines | None = None) -> list[TuneLine]:
    """Every readable line of a tune.jsonl; the others (a torn last line, a damaged one) are
    counted in `bad`."""
    return list(iter_jsonl(path, TuneLine.from_json_line, bad))


def lines_of(lines: list[TuneLine], quant: str) -> list[TuneLine]:
    """The lines of one quantization's latest search (from its last start line on)."""
    mine = [line for line in lines if line.quant == quant]
    starts = [index for index, line in enumerate(mine) if line.kind == "start"]
    return mine[starts[-1] :] if starts else []
