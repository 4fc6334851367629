"""The load step: one experiment against a served target.

The experiments (`load.experiments` chooses which `quantload run` runs, in order):
  sweep         closed loop at each of load.users, with workload.kind's requests
  prefix_cache  a shared system prompt, cache_prompt off then on
  open_loop     Poisson arrivals at each of load.rates_rps (needs them)
  sessions      multi-turn conversations, cache off then on ([sessions])
  trace         trace.path replayed open loop at trace.speed (needs trace.path)
  mixed         decode-heavy traffic alone and with long prompts, at each -b/-ub ([mixed])
  limit_users   the most concurrent users within the SLO ([limit])
  limit_rate    the highest arrival rate within the SLO ([limit])
  kv_types      a decode-heavy stage per KV-cache type of quality.kld_cache_types ([kv_types]);
                it starts llama-servers of its own (`CacheTypeServers`), so only `quantload run`
                runs it
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from quantload.config import ALL_EXPERIMENTS, ExperimentName, KvTypeSettings, Settings
from quantload.errors import ConfigError
from quantload.load.experiments import (
    ServerRestarts,
    log_warning,
    run_mixed,
    run_open_loop,
    run_prefix_cache_experiment,
    run_sessions,
    run_sweep,
    run_trace,
    run_workload_open_loop,
    run_workload_sweep,
)
from quantload.load.kv_types import CacheTypeServers, run_kv_types
from quantload.load.limit_file import LimitLine
from quantload.load.limit_runner import run_limit_search
from quantload.load.records import iter_stage_events
from quantload.load.summary import StageSummary
from quantload.progress import ProgressCallback, no_progress
from quantload.rundir import STAGES_JSONL
from quantload.served import ServedTarget

Experiment = ExperimentName
# what `quantload load` runs against any URL: all but kv_types, which starts servers of its own
EXPERIMENTS: tuple[Experiment, ...] = tuple(kind for kind in ALL_EXPERIMENTS if kind != "kv_types")


@dataclass(frozen=True)
class ExperimentRun:
    """The stages one experiment ran, and how long they took (the time spent measuring)."""

    experiment: Experiment
    summaries: tuple[StageSummary, ...]
    busy_s: float
    limit: LimitLine | None = None  # what a limit search found

    @property
    def problem(self) -> str | None:
        """Why the experiment counts as failed (stages that did not end ok); None when all did.

        A limit search's trials may fail on purpose (a level breaking is how it finds the limit):
        the search fails only when no trial ran at all, or when no level held and every trial
        failed hard (a server answering 503 to everything, a closed port: nothing was measured).
        """
        if self.limit is not None:
            trials = self.limit.trials
            if not trials:
                return "the limit search ran no trial"
            if self.limit.limit is None and all(trial.hard_failure for trial in trials):
                return f"no trial of the limit search could be measured ({trials[0].why})"
            return None
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


def missing_input(experiment: Experiment, settings: Settings) -> str | None:
    """Why `experiment` cannot run with these settings (the input it needs), or None."""
    load = settings.load
    if experiment == "prefix_cache" and (load.prefix_requests <= 0 or load.prefix_tokens <= 0):
        return "load.prefix_tokens or load.prefix_requests is 0"
    if experiment == "open_loop" and not load.rates_rps:
        return "no open-loop rate (load.rates_rps)"
    if experiment == "trace" and not settings.trace.path:
        return "no trace (trace.path)"
    if experiment == "sessions" and settings.sessions.count <= 0:
        return "sessions.count is 0"
    if experiment == "kv_types" and settings.kv_types.requests <= 0:
        return "kv_types.requests is 0"
    if experiment == "kv_types" and len(settings.quality.kld_cache_types) < 2:
        return "quality.kld_cache_types names fewer than two cache types"
    return None


def planned_experiments(settings: Settings) -> list[Experiment]:
    """The experiments the settings ask `quantload run` for, in the order it runs them: those of
    `load.experiments` whose input is there (see `missing_input`)."""
    return [kind for kind in settings.load.experiments if missing_input(kind, settings) is None]


def check_experiments(names: Sequence[str]) -> list[Experiment]:
    """The names as experiments; ConfigError naming the first unknown one."""
    known: list[Experiment] = []
    for name in names:
        match = next((kind for kind in EXPERIMENTS if kind == name), None)
        if name == "kv_types":
            raise ConfigError(
                "the kv_types experiment starts llama-servers of its own, one per KV-cache type",
                "run it through `quantload run`",
            )
        if match is None:
            raise ConfigError(f"unknown experiment {name!r}", f"choose from {', '.join(EXPERIMENTS)}")
        known.append(match)
    return known


def run_experiment(
    experiment: Experiment,
    target: ServedTarget,
    settings: Settings,
    run_dir: Path,
    run_id: str,
    progress: ProgressCallback = no_progress,
    *,
    restarts: ServerRestarts | None = None,
    warn: Callable[[str], None] = log_warning,
    kv_types: KvTypesRun | None = None,
) -> ExperimentRun:
    """Run one experiment's stages; records and stage lines are appended to `run_dir` as they come.

    `restarts` lets the mixed experiment restart the server at its batch sizes; `warn` gets each
    line saying what is wrong with a plan before it starts; kv_types needs `kv_types`: the servers
    of `target`'s file per cache type, and what to run.
    """
    why = missing_input(experiment, settings)
    if why is not None:
        raise ConfigError(
            f"the {experiment} experiment cannot run: {why}", "set it, or leave the experiment out"
        )
    load, observe = settings.load, settings.observe
    prompts = settings.workload.kind == "prompts"
    limit = None
    if experiment == "sweep":
        summaries = (
            run_sweep(target, load, run_dir, run_id, progress, observe=observe, warn=warn)
            if prompts
            else run_workload_sweep(target, settings, run_dir, run_id, progress, warn)
        )
    elif experiment == "prefix_cache":
        summaries = run_prefix_cache_experiment(
            target, load, run_dir, run_id, progress, observe=observe, warn=warn
        )
    elif experiment == "open_loop":
        summaries = (
            run_open_loop(target, load, run_dir, run_id, progress, observe=observe, warn=warn)
            if prompts
            else run_workload_open_loop(target, settings, run_dir, run_id, progress, warn=warn)
        )
    elif experiment == "sessions":
        summaries = run_sessions(target, settings, run_dir, run_id, progress, warn)
    elif experiment == "trace":
        summaries = run_trace(target, settings, run_dir, run_id, progress, warn)
    elif experiment == "mixed":
        summaries = run_mixed(target, settings, run_dir, run_id, progress, restarts, warn)
    elif experiment == "kv_types":
        if kv_types is None:
            raise ConfigError(
                "the kv_types experiment starts llama-servers of its own", "run it through `quantload run`"
            )
        summaries = run_kv_types(
            kv_types.servers, kv_types.cache_types, load, kv_types.settings, run_dir, run_id,
            progress, observe=observe,
        )  # fmt: skip
    else:
        outcome = run_limit_search(experiment, target, settings, run_dir, run_id, progress, warn)
        summaries, limit = list(outcome.summaries), outcome.line
    busy_s = stage_seconds(run_dir / STAGES_JSONL, [s.stage_id for s in summaries])
    return ExperimentRun(experiment, tuple(summaries), busy_s, limit)


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
