"""The load step: one experiment (sweep, prompt cache, open loop, KV-cache types) against a served
target. `quantload load` runs the first three against any URL; kv_types starts servers of its own
(`CacheTypeServers`), so only `quantload run` runs it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from quantload.config import KvTypeSettings, LoadSettings, ObserveSettings, Settings
from quantload.errors import ConfigError
from quantload.load.experiments import run_open_loop, run_prefix_cache_experiment, run_sweep
from quantload.load.kv_types import CacheTypeServers, run_kv_types
from quantload.load.records import iter_stage_events
from quantload.load.summary import StageSummary
from quantload.progress import ProgressCallback, no_progress
from quantload.rundir import STAGES_JSONL
from quantload.served import ServedTarget

Experiment = Literal["sweep", "prefix_cache", "open_loop", "kv_types"]
EXPERIMENTS: tuple[Experiment, ...] = ("sweep", "prefix_cache", "open_loop")  # what `quantload load` runs


@dataclass(frozen=True)
class ExperimentRun:
    """The stages one experiment ran, and how long they took (the time spent measuring)."""

    experiment: Experiment
    summaries: tuple[StageSummary, ...]
    busy_s: float

    @property
    def problem(self) -> str | None:
        """Why the experiment counts as failed (stages that did not end ok); None when all did."""
        failed = [s for s in self.summaries if s.status != "ok"]
        if not failed:
            return None
        first = failed[0]
        return f"{len(failed)} of {len(self.summaries)} stages {first.status}: {first.reason}"


@dataclass(frozen=True)
class KvTypesRun:
    """What the kv_types experiment needs besides a target: a server per cache type, the types
    (quality.kld_cache_types) and the [kv_types] settings."""

    servers: CacheTypeServers
    cache_types: tuple[str, ...]
    settings: KvTypeSettings


def planned_experiments(settings: Settings) -> list[Experiment]:
    """The experiments the settings ask `quantload run` for, in the order it runs them; kv_types
    last, when kv_types.requests > 0 and quality.kld_cache_types lists more than one type."""
    load = settings.load
    kinds: list[Experiment] = ["sweep"]
    if load.prefix_requests > 0 and load.prefix_tokens > 0:
        kinds.append("prefix_cache")
    if load.rates_rps:
        kinds.append("open_loop")
    if settings.kv_types.requests > 0 and len(settings.quality.kld_cache_types) > 1:
        kinds.append("kv_types")
    return kinds


def check_experiments(names: Sequence[str]) -> list[Experiment]:
    """The names as experiments; ConfigError naming the first unknown one."""
    known: list[Experiment] = []
    for name in names:
        match = next((kind for kind in EXPERIMENTS if kind == name), None)
        if match is None:
            raise ConfigError(f"unknown experiment {name!r}", f"choose from {', '.join(EXPERIMENTS)}")
        known.append(match)
    return known


def run_experiment(
    experiment: Experiment,
    target: ServedTarget,
    settings: LoadSettings,
    observe: ObserveSettings,
    run_dir: Path,
    run_id: str,
    progress: ProgressCallback = no_progress,
    *,
    kv_types: KvTypesRun | None = None,
) -> ExperimentRun:
    """Run one experiment's stages; records and stage lines are appended to `run_dir` as they come.

    kv_types needs `kv_types`: the servers of `target`'s file per cache type, and what to run.
    """
    if experiment == "sweep":
        summaries = run_sweep(target, settings, run_dir, run_id, progress, observe=observe)
    elif experiment == "prefix_cache":
        summaries = run_prefix_cache_experiment(target, settings, run_dir, run_id, progress, observe=observe)
    elif experiment == "kv_types":
        if kv_types is None:
            raise ConfigError(
                "the kv_types experiment starts llama-servers of its own", "run it through `quantload run`"
            )
        summaries = run_kv_types(
            kv_types.servers, kv_types.cache_types, settings, kv_types.settings, run_dir, run_id,
            progress, observe=observe,
        )  # fmt: skip
    else:
        summaries = run_open_loop(target, settings, run_dir, run_id, progress, observe=observe)
    busy_s = stage_seconds(run_dir / STAGES_JSONL, [s.stage_id for s in summaries])
    return ExperimentRun(experiment, tuple(summaries), busy_s)


def stage_seconds(stages_path: Path, stage_ids: Sequence[str]) -> float:
    """Wall time spent inside the given stages, from their start and end lines."""
    wanted = set(stage_ids)
    starts: dict[str, float] = {}
    busy = 0.0
    for event in iter_stage_events(stages_path):
        if event.stage_id not in wanted:
            continue
        if event.event == "stage_start":
            starts[event.stage_id] = event.unix_s
        elif event.stage_id in starts:
            busy += event.unix_s - starts.pop(event.stage_id)
    return busy
