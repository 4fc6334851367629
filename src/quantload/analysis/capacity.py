"""The SLO verdict: how much load each quantization is shown to sustain, said in one sentence.

A level is judged by the SLO's one judge (quantload.slo.judge) on the requests of its usable
repeats together: it meets, misses, or is undecided, at the SLO's confidence, and says how many
requests it rests on and how sure it is. The sweep's capacity is the highest of its levels (1, 2,
4, 8 by default) that meets with every lower level meeting too: no capacity rests on an undecided
level. Beside it the verdict names where misses begin and the undecided levels between.

Where the run searched for the limit (limits.jsonl), the verdict names the limit the search found
instead, a level the sweep may never have tried (6 users where the sweep knows only that 4 met and
8 did not), and says beside it what the sweep's levels alone would say.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.stage_tables import level_counts
from quantload.comparison import LimitRange
from quantload.load.limit_file import LimitLine
from quantload.load.limit_search import level_text, level_unit
from quantload.slo import Outcome, Slo, judge


def slo_text(slo: Slo) -> str:
    """The SLO in words."""
    return slo.text()


@dataclass(frozen=True)
class LevelCheck:
    """One concurrency level against the SLO."""

    quant: str
    users: int
    ttft_s: float | None  # TTFT at the SLO's percentile, as the SLO judges it
    tpot_s: float | None  # TPOT at the SLO's percentile
    failed_frac: float | None
    outcome: Outcome
    why: str
    requests: int = 0  # the requests the verdict rests on (its usable repeats together)
    sureness: str = ""  # how sure it is (quantload.slo.Verdict.sureness)
    more_requests: int | None = None  # undecided: about how many more would likely decide it

    @property
    def meets(self) -> bool:
        return self.outcome == "meets"


@dataclass(frozen=True)
class CapacityVerdict:
    """A quantization's capacity under the SLO and the sentence that says it."""

    quant: str
    max_users: int | None  # the highest level that meets, every lower level meeting
    tested_users: tuple[int, ...]
    output_tok_s: float | None
    goodput_rps: float | None
    sentence: str
    checks: tuple[LevelCheck, ...]
    first_miss_users: int | None = None  # the lowest level that misses
    undecided_users: tuple[int, ...] = ()  # the levels neither shown to meet nor to miss
    searched_users: float | None = None  # the limit search's most users (limit_users)
    searched_rate_rps: float | None = None  # the limit search's highest rate (limit_rate)
    sweep_sentence: str = ""  # what the sweep's levels alone say
    searched_goodput_rps: float | None = None  # good requests/s of the search's trial at its limit
    searched_output_tok_s: float | None = None  # their output tokens/s
    searched_lowest_miss: float | None = None  # the lowest level the users search showed to miss

    @property
    def held_users(self) -> int | None:
        """The most users shown to meet the SLO: the limit search's where the run searched, else the
        sweep's."""
        return int(self.searched_users) if self.searched_users is not None else self.max_users

    def limit_range(self) -> LimitRange:
        """Where the most users within the SLO lie: at least the held users, below the first miss."""
        if self.searched_users is not None or self.searched_lowest_miss is not None:
            return LimitRange(self.searched_users, self.searched_lowest_miss)
        missed = self.first_miss_users
        return LimitRange(
            float(self.max_users) if self.max_users is not None else None,
            float(missed) if missed is not None else None,
        )

    @property
    def decided(self) -> bool:
        """Whether any level was shown to meet the SLO (a capacity to plan with)."""
        return self.held_users is not None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _value(row: Any, name: str) -> float | None:
    value = row.get(name)
    return None if value is None or pd.isna(value) else float(value)


def check_level(quant: str, row: dict[str, Any], slo: Slo, machine_busy: str | None = None) -> LevelCheck:
    """Judge one row of the sweep level table: its repeats' requests together."""
    ttft, tpot = _value(row, "ttft_at_slo_s"), _value(row, "tpot_at_slo_s")
    failed = _value(row, "failed_frac")
    users = int(row["users"])
    untrusted = row.get("client_untrusted")
    verdict = judge(
        level_counts(row), slo, users, machine_busy=machine_busy,
        client_untrusted=str(untrusted) if isinstance(untrusted, str) and untrusted else None,
    )  # fmt: skip
    if verdict.outcome == "unjudged":
        return LevelCheck(quant, users, ttft, tpot, failed, "unjudged", "no complete repeat")
    why = verdict.why if verdict.outcome != "meets" else "meets the SLO"
    if verdict.outcome == "misses":
        why = _why(verdict.why, slo, ttft, tpot)
    return LevelCheck(
        quant, users, ttft, tpot, failed, verdict.outcome, why, verdict.requests, verdict.sureness,
        verdict.more_requests,
    )  # fmt: skip


def _busy(row: dict[str, Any]) -> str | None:
    """Why the level measured the machine rather than the server (its stages' own), if it did."""
    said = row.get("machine_busy")
    return said if isinstance(said, str) and said else None


def _why(counts: str, slo: Slo, ttft: float | None, tpot: float | None) -> str:
    """A miss in words: the percentiles the reader sees beside the counts that decided it."""
    shown = [f"TTFT {slo.ttft_percentile} is {fmt.duration(ttft)}" if ttft is not None else ""]
    shown.append(f"TPOT {slo.tpot_percentile} is {fmt.duration(tpot)}" if tpot is not None else "")
    return f"{counts} ({', '.join(part for part in shown if part)})"


def _users(count: int) -> str:
    return f"{count} concurrent user{'s' if count != 1 else ''}"


def capacity_of(checks: Sequence[LevelCheck]) -> int | None:
    """The index of the highest level that meets with every lower level meeting (None: none)."""
    best = None
    for index, check in enumerate(checks):
        if check.outcome == "unjudged":
            continue
        if check.outcome != "meets":
            break
        best = index
    return best


def _sentence(quant: str, checks: Sequence[LevelCheck], best: LevelCheck | None, row: dict[str, Any]) -> str:
    judged = [c for c in checks if c.outcome != "unjudged"]
    if not judged:
        return f"{quant}: not measured: no complete concurrency-sweep stage to judge."
    misses = [c for c in judged if c.outcome == "misses"]
    undecided = [c for c in judged if c.outcome == "undecided" and (best is None or c.users > best.users)]
    tail = []
    if undecided:
        tail.append(f"undecided at {', '.join(str(c.users) for c in undecided)} users")
    if misses:
        tail.append(f"misses from {_users(misses[0].users)}: {misses[0].why}")
    if best is None:
        first = judged[0]
        if first.outcome == "misses":
            return f"{quant} misses the SLO even at {_users(first.users)}: {first.why}."
        need = (
            f" (about {first.more_requests:,} more requests would likely decide it)"
            if first.more_requests
            else ""
        )
        rest = f"; {tail[-1]}" if misses else ""
        return (
            f"{quant}: no level was shown to meet the SLO; at {_users(first.users)} it is undecided:"
            f" {first.why}{need}{rest}."
        )
    rate = fmt.number(_value(row, "output_tok_s"))
    good = fmt.number(_value(row, "goodput_rps"), 2)
    text = (
        f"{quant} meets the SLO up to {_users(best.users)}, delivering {rate} output tok/s"
        f" ({good} good req/s)"
    )
    if not tail and best.users == max(c.users for c in judged):
        text += "; that is the highest level tested, so its limit may lie higher"
    elif tail:
        text += "; " + "; ".join(tail)
    above = [c for c in judged if c.users > best.users]
    if misses and any(c.meets for c in above if c.users > misses[0].users):
        text += " (a higher level met it again: the curve is not monotonic, repeat the run to be sure)"
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
    took = f"{len(line.trials)} trials in {_minutes(line.seconds)}"
    parts = []
    if line.limit is not None:
        shown = level_text(line.limit, line.kind)
        parts.append(f"{shown} {level_unit(line.limit, line.kind)} met it")
    if line.undecided:
        parts.append(f"undecided at {', '.join(level_text(x, line.kind) for x in line.undecided)}")
    if line.lowest_miss is not None:
        parts.append(f"misses from {level_text(line.lowest_miss, line.kind)}")
    said = "; ".join(parts) or "no level decided"
    how = {
        "capped": "; the time cap ended the search",
        "max_level": ", the most the search may try",
        "never_met": "",
        "never_held": "",
        "found": "",
    }.get(line.ending, f"; {line.ending}")
    lead = "" if line.limit is not None else "no level was shown to meet the SLO: "
    return f"{lead}{said}{how} ({line.workload} workload; {took})"


def _with_search(quant: str, sweep: str, users: LimitLine | None, rate: LimitLine | None) -> str:
    if users is None and rate is None:
        return sweep
    parts = []
    if users is not None and users.limit is not None:
        parts.append(
            f"{quant} meets the SLO up to {_users(int(users.limit))}, the limit"
            f" the search found: {search_sentence(users)}"
        )
    elif users is not None:
        parts.append(f"{quant}: {search_sentence(users)}")
    if rate is not None:
        lead = "" if parts else f"{quant}: "
        parts.append(f"{lead}open loop, {search_sentence(rate)}")
    return "; ".join(parts) + f". The sweep's own levels say: {sweep}"


def _at_limit(line: LimitLine | None, stages: pd.DataFrame | None, column: str) -> float | None:
    """The median `column` of the stage table over the search's trials that met at its limit."""
    if line is None or line.limit is None or stages is None or stages.empty or column not in stages:
        return None
    met = {t.stage_id for t in line.trials if t.met and t.level == line.limit and t.stage_id}
    values = stages.loc[stages["stage_id"].isin(met), column].dropna()
    return float(values.median()) if not values.empty else None


def capacity(
    levels: pd.DataFrame,
    quants: Sequence[str],
    slo: Slo,
    limits: Sequence[LimitLine] = (),
    stages: pd.DataFrame | None = None,
    busy: Mapping[tuple[str, int], str] | None = None,
) -> list[CapacityVerdict]:
    """One verdict per quantization of the sweep level table, using the limit searches of
    `limits` where the run has them (see the module docstring); `stages` (the stage table) gives
    the goodput of the users search's trial at its limit; `busy` says, per (quant, users), why the
    machine rather than the server was measured there."""
    verdicts = []
    for quant in quants:
        rows = levels[levels["quant"] == quant].to_dict("records") if not levels.empty else []
        checks = [
            check_level(quant, row, slo, (busy or {}).get((quant, int(row["users"]))) or _busy(row))
            for row in rows
        ]
        best_index = capacity_of(checks)
        best = checks[best_index] if best_index is not None else None
        best_row = rows[best_index] if best_index is not None else {}
        sweep = _sentence(quant, checks, best, best_row)
        users, rate = _latest(limits, quant, "limit_users"), _latest(limits, quant, "limit_rate")
        misses = [c.users for c in checks if c.outcome == "misses"]
        verdicts.append(
            CapacityVerdict(
                quant=quant,
                max_users=best.users if best else None,
                tested_users=tuple(c.users for c in checks),
                output_tok_s=_value(best_row, "output_tok_s"),
                goodput_rps=_value(best_row, "goodput_rps"),
                sentence=_with_search(quant, sweep, users, rate),
                checks=tuple(checks),
                first_miss_users=min(misses) if misses else None,
                undecided_users=tuple(c.users for c in checks if c.outcome == "undecided"),
                searched_users=users.limit if users is not None else None,
                searched_rate_rps=rate.limit if rate is not None else None,
                sweep_sentence=sweep,
                searched_goodput_rps=_at_limit(users, stages, "goodput_rps"),
                searched_output_tok_s=_at_limit(users, stages, "output_tok_s"),
                searched_lowest_miss=users.lowest_miss if users is not None else None,
            )
        )
    return verdicts
