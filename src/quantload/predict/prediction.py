"""One file's predicted capacity: its cost curves, the server's flags and the workload, simulated
level by level up to the first misses, with the limit's interval from the curves' error.

`predict.json` holds every prediction of one `quantload predict` (or of a run before its load):
per label (the quantization) the flags and workload it assumed, the predicted limit with its
interval, and each level's predicted percentiles and where a request's time goes.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantload.config import Settings
from quantload.errors import ConfigError
from quantload.experiments.limit_trials import fewest_requests
from quantload.load.limit_search import LimitResult
from quantload.predict.costs import CostsFile
from quantload.predict.limit import LimitPrediction, SimulatedLoad, predict_limit
from quantload.predict.search import SIMULATION_ENDED, LevelBudget, SearchRules
from quantload.predict.simulator import LOCKSTEP, ClientTiming, ServerModel
from quantload.predict.workload_shapes import WorkloadShapes
from quantload.rundir import read_json, write_json_atomic
from quantload.slo import Slo
from quantload.text_format import span

PREDICT_SCHEMA = "quantload.predict/1"
LLAMA_DEFAULT_BATCH = 2048  # llama-server's -b when not given
LLAMA_DEFAULT_UBATCH = 512  # its -ub
MISSES_PAST = 2  # levels in a row that miss before a sweep stops


@dataclass(frozen=True)
class ServerFlagsUsed:
    """The flags of llama-server a prediction depends on."""

    slots: int
    ctx_per_slot: int
    n_batch: int
    n_ubatch: int
    threads: int
    continuous_batching: bool

    def model(self) -> ServerModel:
        return ServerModel(self.slots, self.ctx_per_slot, self.n_batch, self.continuous_batching)

    def text(self) -> str:
        batching = "" if self.continuous_batching else " -nocb"
        return (
            f"-np {self.slots} -c {self.slots * self.ctx_per_slot} -b {self.n_batch} -ub {self.n_ubatch}"
            f" -t {self.threads}{batching}"
        )


def _flag_value(args: Sequence[str], names: tuple[str, ...]) -> int | None:
    for index, arg in enumerate(args):
        for name in names:
            if arg == name and index + 1 < len(args):
                value = args[index + 1]
            elif arg.startswith(f"{name}="):
                value = arg.split("=", 1)[1]
            else:
                continue
            if not value.isdigit() or int(value) < 1:
                raise ConfigError(f"server.extra_args: {name} {value!r} is not a positive whole number")
            return int(value)
    return None


def server_flags_used(settings: Settings) -> ServerFlagsUsed:
    """The flags `settings` start llama-server with: slots, context, -b/-ub from server.extra_args
    (llama.cpp's defaults otherwise), threads and -nocb."""
    server = settings.server
    args = server.extra_args
    n_batch = _flag_value(args, ("-b", "--batch-size")) or LLAMA_DEFAULT_BATCH
    n_ubatch = min(_flag_value(args, ("-ub", "--ubatch-size")) or LLAMA_DEFAULT_UBATCH, n_batch)
    continuous = not any(arg in ("-nocb", "--no-cont-batching") for arg in args)
    return ServerFlagsUsed(server.slots, server.ctx_per_slot, n_batch, n_ubatch, server.threads, continuous)


def check_costs_match(costs: CostsFile, flags: ServerFlagsUsed, label: str) -> None:
    """ConfigError where the curves were measured with other -b/-ub/-t than the server uses."""
    measured = (costs.n_batch, costs.n_ubatch, costs.n_threads)
    served = (flags.n_batch, flags.n_ubatch, flags.threads)
    if measured != served:
        raise ConfigError(
            f"{label}'s cost curves were measured with -b {measured[0]} -ub {measured[1]} -t {measured[2]},"
            f" the server runs with -b {served[0]} -ub {served[1]} -t {served[2]}",
            "measure them again with the server's flags (leave out --costs)",
        )


@dataclass(frozen=True)
class FilePrediction:
    """One file's prediction and everything it assumed."""

    label: str
    model_path: str
    flags: ServerFlagsUsed
    workload: str
    workload_notes: tuple[str, ...]
    requests_per_level: int
    cost_error_rms: float
    cost_confidence: float
    limit: LimitPrediction
    client: ClientTiming = LOCKSTEP
    budget: LevelBudget | None = None

    def sentence(self) -> str:
        """The prediction in one line; with a predicted search, what that search will show."""
        found = self.limit
        if found.limit is None:
            head = f"{self.label}: not even 1 user is predicted to meet the SLO"
        else:
            head = f"{self.label}: predicted limit {found.limit:g} users"
        low = "none" if found.limit_low is None else f"{found.limit_low:g}"
        high = "none" if found.limit_high is None else f"{found.limit_high:g}"
        said = (
            f"{head} (interval {low} to {high}, from the cost curves' {self.cost_error_rms:.0%} error at"
            f" {self.cost_confidence:.0%})"
        )
        return said + self._search_text()

    def _search_text(self) -> str:
        found, budget = self.limit, self.budget
        if found.search is None or budget is None:
            return ""
        point = "no level" if found.search.limit is None else f"{found.search.limit:g} users"
        low, high = (_limit_text(result) for result in (found.search_low, found.search_high))
        undecided = ", ".join(f"{users:g}" for users in found.search.undecided)
        left = f", undecided at {undecided}" if undecided else ""
        ended = [f"{trial.level:g}" for trial in found.search.trials if trial.why == SIMULATION_ENDED]
        short = (
            f" (at {', '.join(ended)} users {SIMULATION_ENDED}: more simulated requests a level could"
            " decide them)"
            if ended
            else ""
        )
        return (
            f"; a limit search of up to {budget.max_s:g} s a level is predicted to show {point}"
            f" ({low} to {high}){left}, in about {span(found.search.seconds)}{short}"
        )


def _limit_text(result: LimitResult | None) -> str:
    return "none" if result is None or result.limit is None else f"{result.limit:g}"


def client_timing(settings: Settings) -> ClientTiming:
    """The simulated client of `settings`: the load's first-round spread and predict's turnaround."""
    return ClientTiming(settings.load.first_round_jitter_s, settings.predict.client_turnaround_s)


def search_budget(settings: Settings) -> LevelBudget:
    """A limit-search level's budget under `settings` (quantload.experiments.limit_trials)."""
    return LevelBudget(
        max_s=settings.slo.level_max_s, max_requests=settings.slo.level_max_requests,
        planned_per_user=settings.limit.requests_per_user, fewest_planned=fewest_requests(settings),
    )  # fmt: skip


def search_rules(settings: Settings) -> SearchRules:
    """The closed-loop limit search's settings."""
    limit = settings.limit
    return SearchRules(limit.start_users, limit.max_users, limit.growth, limit.time_cap_s)


def predict_file(
    label: str,
    costs: CostsFile,
    flags: ServerFlagsUsed,
    shapes: WorkloadShapes,
    slo: Slo,
    max_users: int,
    requests_per_level: int,
    confidence: float = 0.9,
    seed: int = 0,
    client: ClientTiming = LOCKSTEP,
    search: tuple[LevelBudget, SearchRules] | None = None,
) -> FilePrediction:
    """Simulate closed-loop users 1..max_users (each sweep stopping after MISSES_PAST misses in a
    row) under the fitted curves and their (fast, slow) bounds at `confidence`; with `search`
    (a level's budget and the search's rules), also judge each level as the load would and run
    the limit search on those verdicts. A server left at llama.cpp's default threads (0) runs
    with the count the tool reported using."""
    if flags.threads == 0:
        flags = dataclasses.replace(flags, threads=costs.n_threads)
    check_costs_match(costs, flags, label)
    curves = costs.curves()
    fast, slow = curves.bounds(confidence)
    budget, rules = search if search is not None else (None, None)
    load = SimulatedLoad(
        "closed", shapes.shapes, requests=requests_per_level, warmup_requests=0, client=client, budget=budget
    )
    limit = predict_limit(
        flags.model(), curves, slo, load, range(1, max_users + 1),
        cost_bounds=(fast, slow), seed=seed, misses_past=MISSES_PAST, search=rules,
    )  # fmt: skip
    return FilePrediction(
        label, costs.model_path, flags, shapes.source, shapes.notes, requests_per_level,
        curves.relative_rms, confidence, limit, client, budget,
    )  # fmt: skip


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: _jsonable(getattr(value, field.name)) for field in dataclasses.fields(value)}
    if isinstance(value, (tuple, list)):
        return [_jsonable(item) for item in value]
    return value


def predict_body(predictions: Sequence[FilePrediction]) -> dict[str, Any]:
    """predict.json's object: every file's prediction, by label."""
    return {"schema": PREDICT_SCHEMA, "predictions": {p.label: _jsonable(p) for p in predictions}}


def merge_predict_file(path: Path, prediction: FilePrediction) -> None:
    """Add (or replace) one file's prediction in the predict.json at `path`, created when absent;
    one that is not a predict.json (unreadable, another schema) is replaced. Written atomically
    (a temporary file of this writer's own, renamed over it)."""
    kept: dict[str, Any] = {}
    if path.is_file():
        try:
            current = read_json(path)
        except (ValueError, OSError):
            current = None
        if isinstance(current, dict) and current.get("schema") == PREDICT_SCHEMA:
            found = current.get("predictions")
            kept = dict(found) if isinstance(found, dict) else {}
    kept[prediction.label] = _jsonable(prediction)
    write_json_atomic(path, {"schema": PREDICT_SCHEMA, "predictions": kept})


def write_predict_file(path: Path, predictions: Sequence[FilePrediction]) -> None:
    """predict.json, written whole or not at all."""
    body = predict_body(predictions)
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(body, indent=2) + "\n", encoding="utf-8")
    partial.replace(path)
