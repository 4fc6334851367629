"""`quantload load`: stream load at running servers, headless, and summarize every stage.

The command parses its options into one `LoadFlags` and hands them on; the run's folder, context,
experiments and failure rule are the run driver's (quantload.stack.run_driver), its console
lines quantload.cli.load_console's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import typer
from pydantic import SecretStr

from quantload.cli import load_options as opt
from quantload.cli.context import CliContext, cli_context
from quantload.cli.exclusive_option import EXCLUSIVE, quiet_before
from quantload.cli.load_console import (
    master_lines,
    remote_worker_lines,
    say_failures,
    say_stage_warnings,
    show_stages,
)
from quantload.cli.load_flags import LoadFlags
from quantload.cli.progress_view import progress_bar
from quantload.cli.slo_options import CONFIDENCE, SLO_TPOT, SLO_TPOT_PERCENTILE, SLO_TTFT, SLO_TTFT_PERCENTILE
from quantload.config import ResolvedConfig, Settings
from quantload.errors import ConfigError
from quantload.experiments import registry
from quantload.experiments.base import Experiment
from quantload.experiments.soak import NAME as SOAK
from quantload.load.calibration_file import machine_limits
from quantload.load.processes import choose_workers, usable_cores, workers_absent
from quantload.load.workload_builder import ignored_flags
from quantload.paths import cache_root, check_out_dir
from quantload.progress import ProgressCallback
from quantload.rundir import make_run_id
from quantload.rundir.config_file import write_load_config
from quantload.rundir.gpu_file import watch_idle
from quantload.rundir.handle import RunDir
from quantload.served import ServedTarget
from quantload.stack.run_driver import ExperimentOutcome, RunDriver, RunPlace
from quantload.stack.run_steps import RunSteps


def load(
    ctx: typer.Context,
    url: list[str] = opt.URL,
    out: Path = opt.OUT,
    name: list[str] | None = opt.NAME,
    quant: list[str] | None = opt.QUANT,
    model: str = opt.MODEL,
    experiment: list[str] | None = opt.EXPERIMENT,
    workload: str | None = opt.WORKLOAD,
    input_lengths: str | None = opt.INPUT_LENGTHS,
    output_lengths: str | None = opt.OUTPUT_LENGTHS,
    dataset: str | None = opt.DATASET,
    trace: str | None = opt.TRACE,
    speed: float | None = opt.SPEED,
    turns: int | None = opt.TURNS,
    sessions: int | None = opt.SESSIONS,
    think_time: float | None = opt.THINK_TIME,
    affinity: str | None = opt.AFFINITY,
    batch_sizes: str | None = opt.BATCH_SIZES,
    time_cap: float | None = opt.TIME_CAP,
    max_users: int | None = opt.MAX_USERS,
    duration: str | None = opt.DURATION,
    users: str | None = opt.USERS,
    repeats: int | None = opt.REPEATS,
    rates: str | None = opt.RATES,
    prompts: str | None = opt.PROMPTS,
    prompt_count: int | None = opt.PROMPT_COUNT,
    max_tokens: int | None = opt.MAX_TOKENS,
    ignore_eos: bool | None = opt.IGNORE_EOS,
    cache_prompt: bool | None = opt.CACHE_PROMPT,
    workers: str | None = opt.WORKERS,
    remote_workers: int | None = opt.REMOTE_WORKERS,
    master_host: str | None = opt.MASTER_HOST,
    master_port: int | None = opt.MASTER_PORT,
    workers_timeout: float | None = opt.WORKERS_TIMEOUT,
    metrics_host: str | None = opt.METRICS_HOST,
    metrics_port: int | None = opt.METRICS_PORT,
    request_timeout: float | None = opt.REQUEST_TIMEOUT,
    first_byte_timeout: float | None = opt.FIRST_BYTE_TIMEOUT,
    api_key_env: str | None = opt.API_KEY_ENV,
    run_id: str | None = opt.RUN_ID,
    exclusive: bool | None = EXCLUSIVE,
    slo_ttft: float | None = SLO_TTFT,
    slo_ttft_percentile: str | None = SLO_TTFT_PERCENTILE,
    slo_tpot: float | None = SLO_TPOT,
    slo_tpot_percentile: str | None = SLO_TPOT_PERCENTILE,
    confidence: float | None = CONFIDENCE,
    as_json: bool = opt.AS_JSON,
) -> None:
    """Stream chat completions at each --url in turn; one record per request, one summary per stage.

    With observe.grafana_url set, each experiment's stages then become Grafana annotations.
    """
    flags = LoadFlags(
        url=url, out=out, name=name, quant=quant, model=model, experiment=experiment, workload=workload,
        input_lengths=input_lengths, output_lengths=output_lengths, dataset=dataset, trace=trace, speed=speed,
        turns=turns, sessions=sessions, think_time=think_time, affinity=affinity, batch_sizes=batch_sizes,
        time_cap=time_cap, max_users=max_users, duration=duration, users=users, repeats=repeats, rates=rates,
        prompts=prompts, prompt_count=prompt_count, max_tokens=max_tokens, ignore_eos=ignore_eos,
        cache_prompt=cache_prompt, workers=workers, remote_workers=remote_workers, master_host=master_host,
        master_port=master_port, workers_timeout=workers_timeout, metrics_host=metrics_host,
        metrics_port=metrics_port, request_timeout=request_timeout, first_byte_timeout=first_byte_timeout,
        api_key_env=api_key_env, run_id=run_id, exclusive=exclusive, slo_ttft=slo_ttft,
        slo_ttft_percentile=slo_ttft_percentile, slo_tpot=slo_tpot, slo_tpot_percentile=slo_tpot_percentile,
        confidence=confidence, as_json=as_json,
    )  # fmt: skip
    run_load(cli_context(ctx), flags)


def register(app: typer.Typer) -> None:
    """Add the `load` command."""
    app.command("load")(load)


@dataclass(frozen=True)
class LoadPlan:
    """What the load will do, checked before any of it starts."""

    config: ResolvedConfig
    targets: tuple[ServedTarget, ...]
    experiments: tuple[Experiment, ...]
    run_id: str

    @property
    def settings(self) -> Settings:
        return self.config.settings


@dataclass(frozen=True)
class LoadDone:
    """Every experiment attempted, and why the load workers did not join (None: they did)."""

    outcomes: tuple[ExperimentOutcome, ...]
    workers_missing: str | None
    failed: bool

    def counted(self) -> list[ExperimentOutcome]:
        """The outcomes said one by one: not those whose workers did not join (said once)."""
        return [o for o in self.outcomes if o.run is None or not workers_absent(o.run.summaries)]


def run_load(cli: CliContext, flags: LoadFlags) -> None:
    """The whole command after its options are parsed: plan, load, say; exit 1 when a part failed."""
    plan = _plan(cli, flags)
    done = _drive(cli, flags, plan)
    summaries = [s for o in done.outcomes if o.run is not None for s in o.run.summaries]
    RunDir(flags.out).write_load_summary(summaries)
    if flags.as_json:
        typer.echo(json.dumps([s.to_dict() for s in summaries], indent=2))
    else:
        show_stages(cli, summaries, done.counted())
        cli.console.print(f"records: {flags.out / 'records.jsonl'}  run id: {plan.run_id}")
    say_stage_warnings(cli, summaries)
    say_failures(cli, plan.settings.load, done.counted(), done.workers_missing)
    if done.failed:
        raise typer.Exit(1)


def _plan(cli: CliContext, flags: LoadFlags) -> LoadPlan:
    """The configuration with the flags, the targets and the experiments, each checked (a
    ConfigError before any work), with what the console should know said."""
    given = flags.settings()
    config = cli.config(given)
    settings = config.settings
    for line in ignored_flags(settings, given):
        _warn(cli, line)
    check_out_dir(flags.out)
    experiments = registry.against_any_server(flags.experiment or ["sweep"], settings)
    if flags.duration is not None and all(kind.name != SOAK for kind in experiments):
        _warn(cli, f"--duration is read by the soak experiment only: add -e {SOAK}")
    targets = _targets(cli, flags, settings)
    _say_layout(cli, flags, settings, experiments)
    run_id = flags.run_id or make_run_id(settings.model_dump(mode="json"))
    return LoadPlan(config, tuple(targets), tuple(experiments), run_id)


def _warn(cli: CliContext, line: str) -> None:
    cli.err_console.print(f"warning: {line}", highlight=False, soft_wrap=True)


def _targets(cli: CliContext, flags: LoadFlags, settings: Settings) -> list[ServedTarget]:
    """One target per --url, with its --name and --quant, and the API key."""
    names, quants = list(flags.name or []), list(flags.quant or [])
    if len(names) > len(flags.url) or len(quants) > len(flags.url):
        raise ConfigError("more --name/--quant than --url", "give one per --url, in order")
    api_key = settings.server.api_key.get_secret_value() if settings.server.api_key else None
    if flags.api_key_env is not None:
        api_key = cli.environ.get(flags.api_key_env) or os.environ.get(flags.api_key_env)
        if not api_key:
            raise ConfigError(f"environment variable {flags.api_key_env} is empty or unset")
    secret = SecretStr(api_key) if api_key else None
    return [
        ServedTarget(
            name=names[i] if i < len(names) else f"server{i}",
            quant=quants[i] if i < len(quants) else "unknown",
            model=flags.model,
            url=address,
            api_key=secret,
        )
        for i, address in enumerate(flags.url)
    ]


def _say_layout(cli: CliContext, flags: LoadFlags, settings: Settings, experiments: list[Experiment]) -> None:
    """The load processes' layout: the workers chosen, the master's address, remote workers."""
    searches_users = any(kind.name == "limit_users" for kind in experiments)
    most_users = max(*settings.load.users, settings.limit.max_users if searches_users else 1)
    per_process = machine_limits(settings, cli.cwd).streams_per_process  # as the layout will
    choice = choose_workers(settings.load.workers, most_users, usable_cores(), per_process)
    if choice.warning:
        cli.err_console.print(f"warning: {choice.warning}")
    for line in master_lines(settings.load, choice.workers, flags.master_host, flags.master_port):
        _warn(cli, line)
    for line in remote_worker_lines(settings.load):
        cli.err_console.print(line, highlight=False, soft_wrap=True)


def _drive(cli: CliContext, flags: LoadFlags, plan: LoadPlan) -> LoadDone:
    """Every experiment against every target through the run driver, under its failure rule."""
    settings = plan.settings
    write_load_config(flags.out, plan.config)  # the report's sections read the settings this load ran with
    steps = RunSteps(settings, cli.environ, cache_root(settings.toolchain.cache_dir, cli.environ))
    with progress_bar(cli.err_console, "load") as progress:
        place = RunPlace(
            flags.out, plan.run_id, cli.cwd, cli.environ,
            warn=lambda line: cli.err_console.print(f"warning: {line}", soft_wrap=True),
        )  # fmt: skip
        driver = RunDriver(place, settings, _BarView(progress), steps, record=False)  # --out may hold a run's
        if settings.observe.idle_baseline == "on":  # these servers are not ours: asked for only
            seconds = settings.observe.idle_baseline_s
            cli.err_console.print(f"GPUs idle for {seconds:g} s before the load (observe.idle_baseline)")
            watch_idle([target.quant for target in plan.targets], seconds, RunDir(flags.out).gpu_path)
        outcomes: list[ExperimentOutcome] = []
        for target in plan.targets:
            if driver.workers_missing:
                break
            waited = quiet_before(settings.load, target.url, lambda line: progress(0, None, line))
            if waited is not None:
                cli.err_console.print(f"{target.name}: {waited}", highlight=False, soft_wrap=True)
            # observe.grafana_url: stage annotations; no server control: these servers are not ours
            outcomes += driver.run_experiments(target, plan.experiments)
    return LoadDone(tuple(outcomes), driver.workers_missing, bool(driver.failures()))


class _BarView:
    """The load's RunView: every experiment drives the one progress bar; a failure is said once,
    after the stage table (quantload.cli.load_console), not as it happens."""

    def __init__(self, progress: ProgressCallback) -> None:
        self.progress = progress

    def step(self, title: str) -> ProgressCallback:
        return self.progress

    def message(self, text: str) -> None:
        return None
