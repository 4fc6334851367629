"""The soak's tables: per slice latency, errors, goodput and memory; memory and KV cells over
time; the drift per hour of TTFT p99 and of the server's and the load client's memory.

A soak is found by its start line in soak.jsonl and its stages (those whose id starts with the
soak's invocation); a soak whose file is lost is still shown from its stages, without the server's
readings. Each slice's figures are its stage's row of the stage table (the same summary every stage
gets); the server's memory and KV cells per slice are the median of the readings taken inside the
slice. The drift fits (quantload.analysis.drift) leave out the first `soak.settle_slices` slices,
where caches are still filling.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.drift import Drift, fit_drift
from quantload.analysis.run_data import RunData
from quantload.analysis.stage_tables import stage_counts
from quantload.experiments.soak.stages import NAME
from quantload.experiments.soak.watch import SoakLine, read_soak_lines
from quantload.rundir import SOAK_JSONL
from quantload.rundir.handle import RunDir
from quantload.rundir.jsonl import BadLines
from quantload.slo import Slo, judge

SLICE_COLUMNS: tuple[str, ...] = (
    "slice", "stage_id", "status", "started_unix_s", "ended_unix_s", "mid_unix_s", "requests",
    "ok", "failed", "errors", "good_frac", "goodput_rps", "requests_per_s", "ttft_p50_s",
    "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "client_rss_bytes", "server_rss_bytes",
    "kv_cells_used", "kv_cells_used_max", "slots_busy_max", "client_cpu_frac", "loop_lag_p99_s",
    "client_saturated", "slo_outcome", "slo_why",
)  # fmt: skip
SAMPLE_COLUMNS: tuple[str, ...] = (
    "unix_s", "server_rss_bytes", "kv_cells_used", "kv_cells_total", "slots_busy",
)  # fmt: skip
DRIFT_TTFT = "TTFT p99"
DRIFT_SERVER = "server memory"
DRIFT_CLIENT = "load client memory"
PART_ALL = "all"  # every slice after the settling ones
PART_LATE = "second half"  # the second half of those
SERIES = ((DRIFT_TTFT, "ttft_p99_s"), (DRIFT_SERVER, "server_rss_bytes"), (DRIFT_CLIENT, "client_rss_bytes"))


@dataclass(frozen=True)
class SoakRun:
    """One soak of one server: what it held, each slice, the readings, the drifts."""

    server: str
    quant: str
    invocation: str
    level: str  # "4 users", "2.5 req/s"
    level_from: str
    duration_s: float | None
    slice_s: float | None
    slices_planned: int | None
    memory_source: str | None
    memory_missing: str | None
    slices: pd.DataFrame  # SLICE_COLUMNS
    samples: pd.DataFrame  # SAMPLE_COLUMNS
    drifts: tuple[Drift, ...]
    settle_slices: int
    reading_errors: tuple[str, ...] = ()  # the distinct reasons readings failed

    @property
    def started_unix_s(self) -> float | None:
        starts = self.slices["started_unix_s"].dropna() if not self.slices.empty else pd.Series([])
        return float(starts.min()) if not starts.empty else None

    @property
    def held_s(self) -> float | None:
        """From the first slice's start to the last one's end."""
        if self.slices.empty:
            return None
        ends = self.slices["ended_unix_s"].dropna()
        start = self.started_unix_s
        return float(ends.max()) - start if start is not None and not ends.empty else None

    @property
    def drain_frac(self) -> float | None:
        """The share of the time held that went beyond the slices' own lengths: each slice's last
        requests finishing while no new ones were sent (the load below its level)."""
        held, asked = self.held_s, self.duration_s
        if held is None or asked is None or held <= 0 or self.slices_planned != len(self.slices):
            return None
        return max(held - asked, 0.0) / held

    def drift(self, what: str, part: str = PART_ALL) -> Drift | None:
        return next((d for d in self.drifts if d.what == what and d.part == part), None)

    def to_dict(self) -> dict[str, Any]:
        return {
            "server": self.server,
            "quant": self.quant,
            "invocation": self.invocation,
            "level": self.level,
            "level_from": self.level_from,
            "duration_s": self.duration_s,
            "held_s": self.held_s,
            "drain_frac": self.drain_frac,
            "slice_s": self.slice_s,
            "slices_planned": self.slices_planned,
            "settle_slices": self.settle_slices,
            "memory_source": self.memory_source,
            "memory_missing": self.memory_missing,
            "reading_errors": list(self.reading_errors),
            "drift": [d.to_dict() for d in self.drifts],
            "slices": self.slices.to_dict("records"),
        }


def read_lines(run: RunData) -> tuple[list[SoakLine], BadLines]:
    """soak.jsonl's lines and the ones that could not be read."""
    bad = BadLines(SOAK_JSONL)
    return read_soak_lines(RunDir(run.run_dir).soak_path, bad), bad


def _slice_number(phase: object) -> int:
    found = re.match(r"slice (\d+)", str(phase or ""))
    return int(found.group(1)) if found else 0


def _error_text(errors: object) -> str:
    if not isinstance(errors, dict) or not errors:
        return ""
    return ", ".join(f"{name} {count}" for name, count in sorted(errors.items()))


def _within(samples: pd.DataFrame, start: float | None, end: float | None, column: str) -> pd.Series:
    if samples.empty or start is None or end is None or pd.isna(start) or pd.isna(end):
        return pd.Series([], dtype=float)
    inside = samples[(samples["unix_s"] >= start) & (samples["unix_s"] <= end)]
    return inside[column].dropna()


def slice_table(stages: pd.DataFrame, samples: pd.DataFrame, slo: Slo) -> pd.DataFrame:
    """One row per slice of a soak's stage rows, with the readings taken inside each and the slice's
    own SLO verdict (meets, misses or undecided: quantload.slo)."""
    rows = []
    for stage in stages.to_dict("records"):
        open_loop = stage.get("rate_rps") is not None and not pd.isna(stage.get("rate_rps"))
        in_flight = fmt.cell_float(stage.get("delivered_concurrency" if open_loop else "users"))
        verdict = judge(stage_counts(stage), slo, in_flight, machine_busy=stage.get("machine_busy") or None)
        start, end = fmt.cell_float(stage.get("started_unix_s")), fmt.cell_float(stage.get("ended_unix_s"))
        server = _within(samples, start, end, "server_rss_bytes")
        used = _within(samples, start, end, "kv_cells_used")
        busy = _within(samples, start, end, "slots_busy")
        rows.append(
            {
                "slice": _slice_number(stage.get("phase")),
                "stage_id": stage.get("stage_id"),
                "status": stage.get("status"),
                "started_unix_s": start,
                "ended_unix_s": end,
                "mid_unix_s": (start + end) / 2 if start is not None and end is not None else None,
                "requests": stage.get("requests"),
                "ok": stage.get("ok"),
                "failed": stage.get("failed"),
                "errors": _error_text(stage.get("errors")),
                "good_frac": stage.get("good_frac"),
                "goodput_rps": stage.get("goodput_rps"),
                "requests_per_s": stage.get("requests_per_s"),
                "ttft_p50_s": stage.get("ttft_from_intended_p50_s" if open_loop else "ttft_p50_s"),
                "ttft_p99_s": stage.get("ttft_from_intended_p99_s" if open_loop else "ttft_p99_s"),
                "tpot_p50_s": stage.get("tpot_p50_s"),
                "tpot_p99_s": stage.get("tpot_p99_s"),
                "client_rss_bytes": stage.get("client_rss_bytes"),
                "server_rss_bytes": float(server.median()) if not server.empty else None,
                "kv_cells_used": float(used.median()) if not used.empty else None,
                "kv_cells_used_max": float(used.max()) if not used.empty else None,
                "slots_busy_max": float(busy.max()) if not busy.empty else None,
                "client_cpu_frac": stage.get("client_cpu_frac"),
                "loop_lag_p99_s": stage.get("loop_lag_p99_s"),
                "client_saturated": stage.get("client_saturated"),
                "slo_outcome": verdict.outcome,
                "slo_why": verdict.text(),
            }
        )
    table = pd.DataFrame(rows, columns=list(SLICE_COLUMNS))
    return table.sort_values("slice", kind="stable").reset_index(drop=True) if not table.empty else table


def sample_frame(lines: list[SoakLine], invocation: str) -> tuple[pd.DataFrame, tuple[str, ...]]:
    """A soak's readings as a frame, and the distinct reasons some could not be taken."""
    mine = [line for line in lines if line.event == "sample" and line.invocation == invocation]
    rows = [{name: getattr(line, name) for name in SAMPLE_COLUMNS} for line in mine]
    frame = pd.DataFrame(rows, columns=list(SAMPLE_COLUMNS))
    for column in SAMPLE_COLUMNS:
        frame[column] = pd.to_numeric(frame[column], errors="coerce").astype(float)
    errors = tuple(dict.fromkeys(error for line in mine for error in line.errors))
    return frame, errors


def drifts(slices: pd.DataFrame, settle: int) -> tuple[Drift, ...]:
    """TTFT p99 and the two memories per hour over the slices after the first `settle` that ended
    ok, then over the second half of those alone: a memory that grew while caches filled and then
    stopped shows a slope over all of them and none in the second half; a leak shows both."""
    used = slices[(slices["slice"] > settle) & (slices["status"] == "ok")] if not slices.empty else slices
    found = []
    for part, chosen in ((PART_ALL, used), (PART_LATE, used.iloc[len(used) // 2 :])):
        times = [float(t) for t in chosen["mid_unix_s"]] if not chosen.empty else []
        for what, column in SERIES:
            values = [fmt.cell_float(v) for v in chosen[column]] if not chosen.empty else []
            found.append(fit_drift(what, times, values, part))
    return tuple(found)


def _invocation_of(stage_id: str) -> str:
    return stage_id.rsplit("-", 1)[0]


def soak_runs(lines: list[SoakLine], stages: pd.DataFrame, slo: Slo, settle: int) -> tuple[SoakRun, ...]:
    """Every soak of the run (see the module docstring): those soak.jsonl starts, then those of
    its stages alone, the drifts fitted after the first `settle` slices."""
    soaked = stages[stages["experiment"] == NAME] if not stages.empty else stages
    starts = {line.invocation: line for line in lines if line.event == "soak_start"}
    invocations = list(starts)
    if not soaked.empty:
        invocations += [_invocation_of(str(s)) for s in soaked["stage_id"]]
    runs = []
    for invocation in dict.fromkeys(invocations):
        mine = (
            soaked[soaked["stage_id"].astype(str).str.startswith(f"{invocation}-")]
            if not soaked.empty
            else soaked
        )
        start = starts.get(invocation)
        samples, errors = sample_frame(lines, invocation)
        slices = slice_table(mine, samples, slo)
        first = mine.iloc[0] if not mine.empty else None
        soak_run = SoakRun(
            server=start.server if start else str(first["server"]) if first is not None else "",
            quant=start.quant if start else str(first["quant"]) if first is not None else "",
            invocation=invocation,
            level=_level_text(start, first),
            level_from=(start.level_from or "") if start else "",
            duration_s=start.duration_s if start else None,
            slice_s=start.slice_s if start else None,
            slices_planned=start.slices if start else None,
            memory_source=start.memory_source if start else None,
            memory_missing=start.memory_missing if start else f"{SOAK_JSONL} has no start line for this soak",
            slices=slices,
            samples=samples,
            drifts=drifts(slices, settle),
            settle_slices=settle,
            reading_errors=errors,
        )
        runs.append(soak_run)
    return tuple(runs)


def _level_text(start: SoakLine | None, first: Any) -> str:
    if start is not None:
        return f"{start.rate_rps:.3g} req/s" if start.rate_rps is not None else f"{start.users} users"
    if first is None:
        return ""
    rate = fmt.cell_float(first.get("rate_rps"))
    return f"{rate:.3g} req/s" if rate is not None else f"{first.get('users')} users"
