"""limits.jsonl: one line per limit search (schema `quantload.limit/1`), what it found and how.

Written by `quantload.experiments.limit_trials` when a search ends, read by the report. Each line names
the server and quantization, the search (`limit_users` or `limit_rate`), the workload it sent, the
SLO it judged against, the limit found (null: none held), whether a majority of repeats confirmed
it, how the search ended (found, capped, max_level, never_held), the lowest level that broke, the
time it took, its one-sentence verdict and every trial (level, held, hard failure, seconds, why,
stage id, the requests its verdict rests on and how sure it is).
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from quantload.rundir.jsonl import BadLines, iter_jsonl

LIMIT_SCHEMA = "quantload.limit/1"
SearchExperiment = Literal["limit_users", "limit_rate"]


class TrialLine(BaseModel):
    """One trial of a search as limits.jsonl keeps it."""

    model_config = ConfigDict(extra="ignore")

    level: float
    held: bool
    hard_failure: bool
    seconds: float
    why: str
    stage_id: str | None = None
    requests: int = 0  # the requests its verdict rests on (0: written before trials said)
    sureness: str = ""  # how sure its verdict is (quantload.slo.Verdict.sureness)


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
    slo_ttft_p99_s: float
    slo_tpot_s: float
    limit: float | None
    confirmed: bool
    ending: str
    lowest_broken: float | None
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
