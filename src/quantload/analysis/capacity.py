"""The SLO verdict: how much load each quantization sustains, said in one sentence.

A level is judged by the SLO's one judge (quantload.slo.judge) on the requests of its usable
repeats together: it misses the SLO when more of them failed, or were over the TTFT or the TPOT
limit, than a level within it would show by chance; each check says how many requests it rests on
and how sure it is. The sweep's capacity is the highest of its levels (1, 2, 4, 8 by default)
that meets it with every lower level meeting it too.

Where the run searched for the limit (limits.jsonl), the verdict names the limit the search found
instead, a level the sweep may never have tried (6 users where the sweep knows only that 4 held
and 8 did not), and says beside it what the sweep's levels alone would say.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.stage_tables import level_counts
from quantload.config import ReportSettings
from quantload.load import LimitLine, level_text
from quantload.slo import Slo, judge


def slo_text(slo: ReportSettings) -> str:
    """The SLO in words."""
    return Slo.of(slo).text()


@dataclass(frozen=True)
class LevelCheck:
    """One concurrency level against the SLO; `meets` is None when its figures are missing."""

    quant: str
    users: int
    ttft_p99_s: float | None
    tpot_p99_s: float | None
    failed_frac: float | None
    meets: bool | None
    every_repeat_meets: bool | None
    why: str
    requests: int = 0  # the requests the verdict rests on (its usable repeats together)
    sureness: str = ""  # how sure it is (quantload.slo.Verdict.sureness)


@dataclass(frozen=True)
class CapacityVerdict:
    """A quantization's capacity under the SLO and the sentence that says it."""

    quant: str
    max_users: int | None
    tested_users: tuple[int, ...]
    output_tok_s: float | None
    goodput_rps: float | None
    sentence: str
    checks: tuple[LevelCheck, ...]
    searched_users: float | None = None  # the limit search's most users (limit_users)
    searched_rate_rps: float | None = None  # the limit search's highest rate (limit_rate)
    sweep_sentence: str = ""  # what the sweep's levels alone say
    searched_goodput_rps: float | None = None  # good requests/s of the search's held trials at its limit
    searched_output_tok_s: float | None = None  # their output tokens/s

    @property
    def held_users(self) -> int | None:
        """The most users within the SLO: the limit search's where the run searched, else the sweep's."""
        return int(self.searched_users) if self.searched_users is not None else self.max_users

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _value(row: Any, name: str) -> float | None:
    value = row.get(name)
    return None if value is None or pd.isna(value) else float(value)


def check_level(quant: str, row: dict[str, Any], slo: ReportSettings) -> LevelCheck:
    """Judge one row of the sweep level table: its repeats' requests together, and each repeat."""
    ttft, tpot, failed = _value(row, "ttft_p99_s"), _value(row, "tpot_p99_s"), _value(row, "failed_frac")
    users = int(row["users"])
    pooled, repeats = level_counts(row)
    judged = Slo.of(slo)
    verdict = judge(pooled, judged)
    if verdict.meets is None:
        return LevelCheck(quant, users, ttft, tpot, failed, None, None, "no complete repeat")
    every = all(judge(one, judged).meets for one in repeats) if repeats else None
    why = _why(verdict.why, ttft, tpot) if not verdict.meets else "meets the SLO"
    return LevelCheck(
        quant, users, ttft, tpot, failed, verdict.meets, every, why, verdict.requests, verdict.sureness
    )


def _why(counts: str, ttft: float | None, tpot: float | None) -> str:
    """A miss in words: the percentiles the reader sees beside the counts that decided it."""
    shown = [f"TTFT p99 is {fmt.duration(ttft)}" if ttft is not None else ""]
    shown.append(f"TPOT p99 is {fmt.duration(tpot)}" if tpot is not None else "")
    return f"{counts} ({', '.join(part for part in shown if part)})"


def _sentence(quant: str, checks: Sequence[LevelCheck], best: LevelCheck | None, row: dict[str, Any]) -> str:
    judged = [c for c in checks if c.meets is not None]
    if not judged:
        return f"{quant}: not measured: no complete concurrency-sweep stage to judge."
    if best is None:
        first = judged[0]
        return f"{quant} misses the SLO even at {first.users} concurrent user(s): {first.why}."
    rate = fmt.number(_value(row, "output_tok_s"))
    good = fmt.number(_value(row, "goodput_rps"), 2)
    text = (
        f"{quant} meets the SLO up to {best.users} concurrent user(s),"
        f" delivering {rate} output tok/s ({good} good req/s)"
    )
    above = [c for c in judged if c.users > best.users]
    if not above:
        text += "; that is the highest level tested, so its limit may lie higher"
    else:
        text += f"; at {above[0].users} users {above[0].why}"
        if any(c.meets for c in above[1:]):
            text += " (a higher level met it again: the curve is not monotonic, repeat the run to be sure)"
    if best.every_repeat_meets is False:
        text += f" (at {best.users} users not every repeat met it)"
    return text + "."


def _latest(limits: Sequence[LimitLine], quant: str, experiment: str) -> LimitLine | None:
    """The latest search of `quant`'s server as the run configured it (not of a variant)."""
    found = [
        line
        for line in limits
        if line.quant == quant and line.experiment == experiment and line.variant is None
    ]
    return max(found, key=lambda line: line.unix_s) if found else None


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.1f} min" if seconds >= 90 else f"{seconds:.0f} s"


def search_sentence(line: LimitLine) -> str:
    """What one search found, with how it was bounded and what it took."""
    unit = "concurrent user(s)" if line.kind == "users" else "requests/s"
    took = f"{len(line.trials)} trials in {_minutes(line.seconds)}"
    if line.limit is None:
        return f"the limit search found no level within the SLO ({line.ending}; {took})"
    shown = level_text(line.limit, line.kind)
    broke = "" if line.lowest_broken is None else f", {level_text(line.lowest_broken, line.kind)} broke it"
    how = {
        "found": "held in a majority of repeats",
        "capped": "held before the time cap ended the search"
        if line.confirmed
        else "held once before the time cap",
        "max_level": "held at the most the search may try",
    }.get(line.ending, line.ending)
    return f"{shown} {unit} {how}{broke} ({line.workload} workload; {took})"


def _with_search(quant: str, sweep: str, users: LimitLine | None, rate: LimitLine | None) -> str:
    if users is None and rate is None:
        return sweep
    parts = []
    if users is not None and users.limit is not None:
        parts.append(
            f"{quant} holds the SLO up to {level_text(users.limit, 'users')} concurrent user(s), the limit"
            f" the search found: {search_sentence(users)}"
        )
    elif users is not None:
        parts.append(f"{quant}: {search_sentence(users)}")
    if rate is not None:
        lead = "" if parts else f"{quant}: "
        parts.append(f"{lead}open loop, {search_sentence(rate)}")
    return "; ".join(parts) + f". The sweep's own levels say: {sweep}"


def _at_limit(line: LimitLine | None, stages: pd.DataFrame | None, column: str) -> float | None:
    """The median `column` of the stage table over the search's held trials at its limit."""
    if line is None or line.limit is None or stages is None or stages.empty or column not in stages:
        return None
    held = {t.stage_id for t in line.trials if t.held and t.level == line.limit and t.stage_id}
    values = stages.loc[stages["stage_id"].isin(held), column].dropna()
    return float(values.median()) if not values.empty else None


def capacity(
    levels: pd.DataFrame,
    quants: Sequence[str],
    slo: ReportSettings,
    limits: Sequence[LimitLine] = (),
    stages: pd.DataFrame | None = None,
) -> list[CapacityVerdict]:
    """One verdict per quantization of the sweep level table, using the limit searches of
    `limits` where the run has them (see the module docstring); `stages` (the stage table) gives
    the goodput of the users search's held trials at its limit."""
    verdicts = []
    for quant in quants:
        rows = levels[levels["quant"] == quant].to_dict("records") if not levels.empty else []
        checks = [check_level(quant, row, slo) for row in rows]
        best_index = None
        for index, check in enumerate(checks):
            if check.meets is None:
                continue
            if not check.meets:
                break
            best_index = index
        best = checks[best_index] if best_index is not None else None
        best_row = rows[best_index] if best_index is not None else {}
        sweep = _sentence(quant, checks, best, best_row)
        users, rate = _latest(limits, quant, "limit_users"), _latest(limits, quant, "limit_rate")
        verdicts.append(
            CapacityVerdict(
                quant=quant,
                max_users=best.users if best else None,
                tested_users=tuple(c.users for c in checks),
                output_tok_s=_value(best_row, "output_tok_s"),
                goodput_rps=_value(best_row, "goodput_rps"),
                sentence=_with_search(quant, sweep, users, rate),
                checks=tuple(checks),
                searched_users=users.limit if users is not None else None,
                searched_rate_rps=rate.limit if rate is not None else None,
                sweep_sentence=sweep,
                searched_goodput_rps=_at_limit(users, stages, "goodput_rps"),
                searched_output_tok_s=_at_limit(users, stages, "output_tok_s"),
            )
        )
    return verdicts
