"""Was the machine measured instead of the server? What other processes took of the CPUs while
the run measured (its load stages, llama-bench, llama-perplexity, the roofline probe), said once,
on the report's first screen: by how much, when, which stages, and what to do.

A stage is interfered when other processes took more than `load.interference_cpu_frac` of the
CPUs during it (quantload.machine_share; its verdict is then undecided, never a miss); the
speed and quality tools are held to the same share.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import pandas as pd

from quantload.analysis import fmt
from quantload.analysis.run_data import RunData
from quantload.cpu_share import BUSY_OTHER_CPU_FRAC

EXPERIMENT_WORDS = {
    "sweep": "sweep", "limit_users": "limit search", "limit_rate": "rate search", "open_loop": "open loop",
    "prefix_cache": "prompt-cache experiment", "kv_types": "KV-cache types", "sessions": "sessions",
    "mixed": "mixed traffic", "trace": "trace replay", "context": "context experiment",
    "noisy_neighbour": "noisy neighbour", "soak": "soak",
}  # fmt: skip
WHAT_TO_DO = (
    "Rerun when the machine is quiet, or with `quantload run --exclusive` (`make run EXCLUSIVE=1`):"
    " it waits for other processes to leave the CPUs before each measurement and, with 4 cores or"
    " more, keeps the servers and the load client on separate cores."
)
WHAT_TO_DO_EXCLUSIVE = (
    "The run already waited for a quiet machine (--exclusive) up to load.quiet_wait_s: stop the"
    " other work, or give the wait longer (load.quiet_wait_s)."
)


@dataclass(frozen=True)
class BusyMachine:
    """What other processes took while the run measured."""

    threshold: float
    stages_busy: int
    stages_judged: int  # stages whose CPU share was read
    worst_stage_frac: float | None
    where: tuple[str, ...]  # "Q8_0 sweep at 1, 2 users"
    window: str  # "19:01–19:03 UTC"
    tools: tuple[str, ...]  # "llama-bench Q8_0 46 %"
    exclusive: bool

    @property
    def busy(self) -> bool:
        return self.stages_busy > 0 or bool(self.tools)

    def sentence(self) -> str:
        """The first screen's line: how much, when, which, what to do ('' when it was quiet)."""
        if not self.busy:
            return ""
        parts = []
        if self.stages_busy:
            worst = fmt.percent(self.worst_stage_frac, 0)
            parts.append(
                f"other processes took up to {worst} of the CPUs during {self.stages_busy} of"
                f" {self.stages_judged} load stages ({'; '.join(self.where)}; {self.window}), so those"
                " stages measured the machine, not the server: a miss there is undecided, not a miss"
            )
        if self.tools:
            lead = "and more" if parts else "other processes took more"
            parts.append(
                f"{lead} than {fmt.percent(self.threshold, 0)} while {', '.join(self.tools)} ran: those"
                " speeds and quality timings are low and noisy"
            )
        said = "The machine was busy: " + "; ".join(parts) + ". "
        return said + (WHAT_TO_DO_EXCLUSIVE if self.exclusive else WHAT_TO_DO)


def _clock(unix_s: float) -> str:
    return datetime.fromtimestamp(unix_s, UTC).strftime("%H:%M")


def _level(row: dict[str, object]) -> str:
    rate = fmt.cell_float(row.get("rate_rps"))
    if rate is not None:
        return f"{fmt.number(rate, 2)} req/s"
    users = fmt.cell_float(row.get("users"))
    return f"{users:.0f}" if users is not None else "?"


def _where(busy: pd.DataFrame) -> tuple[str, ...]:
    said = []
    for (quant, experiment), group in busy.groupby(["quant", "experiment"], sort=False):
        levels = list(dict.fromkeys(_level(row) for row in group.to_dict("records")))
        unit = "" if any("req/s" in level for level in levels) else (" user" if levels == ["1"] else " users")
        name = EXPERIMENT_WORDS.get(str(experiment), str(experiment).replace("_", " "))
        said.append(f"{quant} {name} at {', '.join(levels)}{unit}")
    return tuple(said)


def _tools(run: RunData, threshold: float) -> tuple[str, ...]:
    said = []
    if run.speed is not None:
        for quant, entry in run.speed.results.items():
            share = entry.bench.other_cpu_frac
            if share is not None and share > threshold:
                said.append(f"llama-bench {quant} ({fmt.percent(share, 0)})")
        machine = run.speed.machine
        if machine is not None and machine.source == "probe":
            share = machine.other_cpu_frac
            if share is not None and share > threshold:
                said.append(f"the roofline probe ({fmt.percent(share, 0)})")
    kld = run.quality.kld if run.quality is not None else None
    if kld is not None:
        for quant, per_cache in kld.results.items():
            shares = [r.other_cpu_frac for r in per_cache.values() if r.other_cpu_frac is not None]
            if shares and max(shares) > threshold:
                said.append(f"the KL divergence of {quant} ({fmt.percent(max(shares), 0)})")
    return tuple(said)


def busy_machine(run: RunData, stages: pd.DataFrame) -> BusyMachine:
    """What other processes took of the machine during the run's measurements."""
    settings = run.settings
    threshold = settings.load.interference_cpu_frac if settings is not None else BUSY_OTHER_CPU_FRAC
    exclusive = bool(settings.load.exclusive) if settings is not None else False
    judged = stages[stages["other_cpu_frac"].notna()] if "other_cpu_frac" in stages else stages.iloc[0:0]
    flagged = judged[judged["machine_busy"].notna()] if "machine_busy" in judged else judged.iloc[0:0]
    window = ""
    if not flagged.empty:
        starts = pd.to_numeric(flagged["started_unix_s"], errors="coerce").dropna()
        ends = pd.to_numeric(flagged["ended_unix_s"], errors="coerce").dropna()
        if not starts.empty and not ends.empty:
            window = f"{_clock(float(starts.min()))}{fmt.DASH}{_clock(float(ends.max()))} UTC"
    worst = float(flagged["other_cpu_frac"].max()) if not flagged.empty else None
    return BusyMachine(
        threshold, len(flagged), len(judged), worst, _where(flagged) if not flagged.empty else (), window,
        _tools(run, threshold), exclusive,
    )  # fmt: skip

