"""`quantload tune` as local processes: per quantization, its server started, its flags searched
(quantload.tune.search), the outcome written and shown.

  check     the settings (pydantic: slots 0, -ub above -b, a budget shorter than one trial), then
            what this llama-server build accepts (`--help`: KV-cache and speculation types) and the
            model files (a draft of another vocabulary): every one a one-line ConfigError before
            any server starts
  prepare   the model files (quantload.models.prepared; cached)
  tune      per file `prepare.quants` names (`--quants`): its llama-server, restarted in place
            per trial
  outcome   tune.json: per quantization the ranking, the winner's command line, its .env and
            compose lines, the search's cost against the full grid and the capacity plan on the
            winner (quantload.tune.outcome); tune.jsonl holds every trial as it ended

Each quantization's server (started with its KV-cache and offload checks, kv.json and gpu.json)
and its tune are steps of the run driver (quantload.stack.run_driver), under its failure rule: a
quantization whose server does not start or whose tune fails is said, and the next one is tuned;
`TuneResult.failures` lists them (the command then exits 1). A ConfigError still ends the tune.

A new tune writes a new run directory under `run.out` (config.json, tune.jsonl, the trials'
records, stages, summaries and limit searches, variants.jsonl, the servers' logs); `resume` goes
on in an earlier one: its trials are taken as measured, and only the settings' budget may differ.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from quantload.config import ResolvedConfig, Settings
from quantload.errors import ConfigError
from quantload.experiments.base import ExperimentContext
from quantload.llamacpp.server import free_port
from quantload.llamacpp.server_help import server_build
from quantload.llamacpp.toolchain import Toolchain
from quantload.models.prepared import PreparedModels
from quantload.paths import cache_root
from quantload.predict.costs import CostsFile, write_costs_file
from quantload.predict.measure import GEN_TOKENS, measure_costs, measuring_grid
from quantload.predict.prediction import ServerFlagsUsed
from quantload.predict.workload_shapes import workload_shapes
from quantload.progress import ProgressCallback
from quantload.rundir import TUNE_JSONL
from quantload.rundir.handle import RunDir
from quantload.stack.run_driver import Failed, RunDriver, RunPlace, RunView, new_run_dir
from quantload.stack.run_steps import RunSteps, Served
from quantload.text_format import span
from quantload.tune.outcome import quant_summary, write_tune_json
from quantload.tune.predicted import CostFlags
from quantload.tune.search import TuneOutcome, tune_quant
from quantload.tune.space import check_space, model_identity


@dataclass(frozen=True)
class QuantTune:
    """One quantization's tune and everything shown of it."""

    quant: str
    outcome: TuneOutcome
    summary: dict[str, Any]  # its entry of tune.json


@dataclass(frozen=True)
class TuneResult:
    """The quantizations tuned, and the steps that failed (the command exits 1 when any did)."""

    run_dir: Path
    quants: tuple[QuantTune, ...]
    failures: tuple[str, ...] = ()


def _run_dir(out: Path, config: ResolvedConfig, resume: Path | None) -> Path:
    if resume is None:
        return new_run_dir(out, config)
    if not RunDir(resume).tune_state_path.is_file():
        raise ConfigError(f"{resume} holds no {TUNE_JSONL} to resume", "give the run directory of a tune")
    return resume


def tuned_quants(settings: Settings, models: PreparedModels) -> list[str]:
    """The files a tune searches, in the manifest's order: those `prepare.quants` and
    `prepare.mixes` name (the reference, made for KLD, only when named), or every given file."""
    every = models.quants()
    if settings.prepare.files:
        return every
    asked = {label.upper() for label in settings.prepare.quants}
    asked |= {mix.name.upper() for mix in settings.prepare.mixes}
    return [quant for quant in every if quant.upper() in asked] or every


def time_said(settings: Settings, quant_count: int) -> str:
    """What the tune will take, said before it starts: `tune.budget_s` per quantization bounds its
    trials and its baseline search together."""
    budget = settings.tune.budget_s
    baseline = " and the configured flags' search" if settings.tune.baseline else ""
    return (
        f"tune: {quant_count} quantization(s), at most about {span(budget * quant_count)} of trials{baseline}"
        f" ({span(budget)} each, tune.budget_s; a level under way when it runs out is finished)"
    )


def tune_models(
    config: ResolvedConfig,
    environ: Mapping[str, str],
    out: Path,
    view: RunView,
    resume: Path | None = None,
    cwd: Path | None = None,
    steps: RunSteps | None = None,
) -> TuneResult:
    """Tune every quantization of the settings (see the module docstring)."""
    settings = config.settings
    steps = steps or RunSteps(settings, environ, cache_root(settings.toolchain.cache_dir, environ))
    toolchain = steps.toolchain(view.step("llama.cpp tools"))
    build = server_build(toolchain)
    check_space(settings, build)  # what the settings and the build say, before any file is made
    run_dir = _run_dir(out, config, resume)
    view.message(f"run directory: {run_dir}")
    place = RunPlace(run_dir, run_dir.name, cwd or Path.cwd(), environ, loadgen_port=free_port())
    driver = RunDriver(place, settings, view, steps, record=False)  # tune.jsonl is its state on disk
    models = steps.prepare(toolchain, run_dir, view.step(f"prepare {settings.model.source}"))
    quants = tuned_quants(settings, models)
    check_space(settings, build, {quant: models.path(quant) for quant in quants})
    view.message(time_said(settings, len(quants)))
    done: list[QuantTune] = []
    for quant in quants:
        with contextlib.ExitStack() as stack:
            served = driver.serve(toolchain, models, quant, stack, then=("tune",))
            if isinstance(served, Failed):
                continue
            tuned = driver.attempt_against(
                served.load_target(), "tune", f"tune {quant}",
                functools.partial(_tune_one, driver, toolchain, models, served, resume is not None),
                lambda one, _: (one.outcome.busy_s, None), served.server,
            )  # fmt: skip
        if not isinstance(tuned, Failed):
            done.append(tuned)
    return TuneResult(run_dir, tuple(done), tuple(driver.failures()))


def _tune_one(
    driver: RunDriver,
    toolchain: Toolchain,
    models: PreparedModels,
    served: Served,
    resuming: bool,
    progress: ProgressCallback,
) -> QuantTune:
    """One quantization's tune, its server restarted in place per trial; its entry of tune.json
    written."""
    quant, server, run_dir = served.quant, served.server, driver.run_dir
    variants = driver.steps.server_variants(toolchain, served, run_dir, True)
    model = model_identity(
        driver.settings.model.source, models.path(quant), models.manifest.files[quant].sha256
    )
    state = driver.context.run_dir.tune_state_path if resuming else None
    context = ExperimentContext(driver.context.with_progress(progress), served.load_target(), variants)
    measure = None
    if driver.settings.tune.predict_first:
        measure = functools.partial(
            _measure_costs, driver.settings, toolchain, models.path(quant), run_dir, quant
        )
    outcome = tune_quant(context, state, model, measure)
    size = models.path(quant).stat().st_size
    summary = quant_summary(
        outcome, server.spec, driver.settings, toolchain.path("llama-server"), size, server.port
    )  # fmt: skip
    write_tune_json(run_dir, quant, summary)
    return QuantTune(quant, outcome, summary)


def _measure_costs(
    settings: Settings, toolchain: Toolchain, model_path: Path, run_dir: Path, quant: str, flags: CostFlags
) -> CostsFile:
    """One combination's cost curves for `tune.predict_first`: llama-batched-bench with its flags
    over the workload's prompt lengths and up to the space's most slots, written beside the tune
    (costs-<quant>-<flags>.json)."""
    shapes = workload_shapes(settings)
    ctx = settings.tune.ctx_per_slot or settings.server.ctx_per_slot
    most = ServerFlagsUsed(max(settings.tune.slots), ctx, flags.n_batch, flags.n_ubatch, flags.threads, True)
    npp, npl = measuring_grid(shapes, most)
    costs = measure_costs(
        toolchain, model_path, npp, (GEN_TOKENS,), npl, flags.threads, flags.n_batch, flags.n_ubatch,
        extra_args=flags.args(),
    )  # fmt: skip
    name = f"b{flags.n_batch}-ub{flags.n_ubatch}-t{flags.threads}-kv-{flags.cache_type}-fa-{flags.flash_attn}"
    write_costs_file(run_dir / f"costs-{quant}-{name}.json", costs)
    return costs


def tune_json_text(result: TuneResult) -> str:
    """The outcome of every quantization as JSON (what `--json` prints)."""
    return json.dumps({quant.quant: quant.summary for quant in result.quants}, indent=2)
