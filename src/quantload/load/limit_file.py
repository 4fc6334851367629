"""limits.jsonl: one line per limit search (schema `quantload.limit/2`), what it found and how.

Written by `quantload.experiments.limit_trials` when a search ends, read by the report. Each line names
the server and quantization, the search (`limit_users` or `limit_rate`), the workload it sent, the
SLO it judged against, the limit found (the highest level shown to meet the SLO, every level tried
below it meeting; null: none), the lowest level shown to miss it, the levels left undecided, how
the search ended (found, capped, max_level, never_met), the time it took, its one-sentence verdict
and every trial (level, outcome, hard failure, seconds, why, stage id, the requests its verdict
rests on and how sure it is). Lines of the first schema (a trial "held" or not, a limit
"confirmed" by a majority of repeats) read as meets and misses.
"""

from __future__ import annotations

__all__ = ["LimitLine", "SearchExperiment", "TrialLine", "read_limits"]

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, model_validator

from quantload.rundir.jsonl import BadLines, iter_jsonl

LIMIT_SCHEMA = "quantload.limit/2"
SearchExperiment = Literal["limit_users", "limit_rate"]


class TrialLine(BaseModel):
    """One trial of a search as limits.jsonl keeps it."""

    model_config = ConfigDict(extra="ignore")

    level: float
    outcome: Literal["meets", "misses", "undecided"]
    hard_failure: bool
    seconds: float
    why: str
    stage_id: str | None = None
    requests: int = 0  # the requests its verdict rests on (0: written before trials said)
    sureness: str = ""  # how sure its verdict is (quantload.slo.Verdict.sureness)

    @model_validator(mode="before")
    @classmethod
    def _first_schema(cls, data: object) -> object:
        """A trial of the first schema said whether its level held: meets or misses."""
        if isinstance(data, dict) and "outcome" not in data and "held" in data:
            return {**data, "outcome": "meets" if data["held"] else "misses"}
        return data

    @property
    def met(self) -> bool:
        return self.outcome == "meets"


class LimitLine(BaseModel):
    """One line of limits.jsonl: a finished (or capped) search against one server."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)

    schema_: str = Field(default=LIMIT_SCHEMA, alias="schema")
    run_id: str
    server: str
    quant: str
    experiment: SearchExperiment
    kind: Literal["users", "rate_rps"]
    workload: str
    slo_ttft_s: float = Field(validation_alias=AliasChoices("slo_ttft_s", "slo_ttft_p99_s"))
    slo_tpot_s: float
    slo_ttft_percentile: str = "p99"
    slo_tpot_percentile: str = "p99"
    slo_confidence: float = 0.95
    limit: float | None
    ending: str
    lowest_miss: float | None = Field(validation_alias=AliasChoices("lowest_miss", "lowest_broken"))
    undecided: list[float] = Field(default_factory=list)
    seconds: float
    sentence: str
    trials: list[TrialLine]
    unix_s: float
    variant: str | None = None  # the server flags searched, when not the run's own (e.g. "-np 4")

    @classmethod
    def from_json_line(cls, line: str) -> LimitLine:
        return cls.model_validate_json(line)


def read_limits(path: Path, bad: BadLines | None = None) -> list[LimitLine]:
    """Every search of a run; a line that cannot be read is counted in `bad` (the report says so)."""
    return list(iter_jsonl(path, LimitLine.from_json_line, bad))
