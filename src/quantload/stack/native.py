"""`quantload run` as plain local processes: the named steps in order, every child supervised.

  toolchain -> prepare -> preflight (when an experiment or the tune checks its input)
  -> quality (per file) -> machine probe -> speed (per file)
  -> Prometheus (when installed) -> per quantization: llama-server, KV check, [tune and serve
  with the winner's flags, with run.tune], the load experiments of `load.experiments`
  (quantload.experiments.registry; those that vary the server's flags run its variants), stop
  -> run.json "finished" -> report

The steps are quantload.steps, reached through `RunSteps` (bound to the run's settings), which
tests replace with fakes. run.json records each step as it begins and ends. A step that fails
with a QuantloadError is recorded "failed" and the run goes on, except the two it cannot go on
without (toolchain, prepare), whose error ends the run. A llama-server that dies fails its
quantization's remaining steps; the others still run.

Every child (llama-servers, the exporter, Prometheus) is entered into an ExitStack before it is
started, so it is stopped by its own handle on the way out whatever happens: a failure, a bug, or
an interruption (Ctrl-C, SIGTERM and SIGHUP all arrive as KeyboardInterrupt, see
quantload.cli.main). Killed outright, quantload takes them along too (quantload.childproc).
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from quantload.analysis import ReportPaths
from quantload.config import ResolvedConfig, Settings
from quantload.errors import QuantloadError
from quantload.exclusive import core_plan, pin_this_process, wait_for_quiet
from quantload.experiments import registry
from quantload.experiments.base import ExperimentRun, Preflight, ServerControl, no_check
from quantload.exporter import ExporterHandle
from quantload.llamacpp.placement import check_placement, placement_args
from quantload.llamacpp.server import LlamaServer, free_port
from quantload.llamacpp.toolchain import Toolchain
from quantload.load.calibration_file import machine_limits
from quantload.load.processes import most_workers
from quantload.observe.prometheus import PrometheusProcess
from quantload.paths import cache_root
from quantload.progress import ProgressCallback
from quantload.run_context import RunContext
from quantload.rundir import make_run_id
from quantload.rundir.config_file import write_run_config
from quantload.rundir.handle import RunDir
from quantload.rundir.run_file import RunStatus
from quantload.served import ServedTarget, server_alias, server_name
from quantload.stack.run_state import RunState
from quantload.stack.run_steps import RunSteps, Served
from quantload.steps.prepare import PreparedModels

T = TypeVar("T")


class RunView(Protocol):
    """How the run shows itself: one step at a time, each with its own progress."""

    def step(self, title: str) -> ProgressCallback:
        """A new step begins; the returned callback reports its progress."""
        ...

    def message(self, text: str) -> None:
        """A line worth showing between steps."""
        ...


@dataclass(frozen=True)
class Failed:
    """A step that ended failed; `why` is what run.json records."""

    why: str


@dataclass(frozen=True)
class RunOutcome:
    """Where the run is, its report when one was written, and what the run said early that its
    last lines say again (a step skipped for want of an input, and how to give it)."""

    run_dir: Path
    report: ReportPaths | None
    again: tuple[str, ...] = ()


@dataclass(frozen=True)
class RunPorts:
    """Ports chosen before anything starts: Prometheus' configuration needs them all."""

    exporter: int
    loadgen: int  # the driving Locust process; its workers (load.workers) take +1, +2, ...

    @classmethod
    def pick(cls, settings: Settings) -> RunPorts:
        return cls(free_port(settings.observe.exporter_host), free_port(settings.load.metrics_host))

    def loadgen_urls(self, settings: Settings, cwd: Path) -> list[str]:
        """Every load process's /metrics, as `quantload.load.processes` numbers them (over the
        streams this machine's calibration proved, as the load's layout will)."""
        host = settings.load.metrics_host
        workers = most_workers(settings.load, per_process=machine_limits(settings, cwd).streams_per_process)
        ports = [self.loadgen] + [self.loadgen + 1 + i for i in range(workers)]
        return [f"http://{host}:{port}" for port in ports]


def new_run_dir(out: Path, config: ResolvedConfig) -> Path:
    """A fresh folder `out/<run-id>`; never an existing one, so a finished run is never overwritten."""
    run_id = make_run_id(config.settings.model_dump(mode="json"))
    run_dir = out / run_id
    suffix = 1
    while run_dir.exists():
        suffix += 1
        run_dir = out / f"{run_id}-{suffix}"
    run_dir.mkdir(parents=True)
    RunDir(run_dir).logs_path.mkdir()
    return run_dir


# How a step's time is accounted: (time spent measuring, why it counts as failed though it ran).
Account = Callable[[T, float], tuple[float | None, str | None]]


def overhead(result: object, wall_s: float) -> tuple[float | None, str | None]:
    """Starting and stopping things: none of it is measuring."""
    return None, None


def measuring(result: object, wall_s: float) -> tuple[float | None, str | None]:
    """The whole step measures (a perplexity, a benchmark, a preparation)."""
    return wall_s, None


def experiment_account(result: ExperimentRun, wall_s: float) -> tuple[float | None, str | None]:
    """A load experiment measures inside its stages; a stage that did not end ok fails it."""
    return result.busy_s, result.problem


class NativeRun:
    """One run of the whole protocol on this machine (see the module docstring)."""

    def __init__(
        self,
        config: ResolvedConfig,
        environ: Mapping[str, str],
        out: Path,
        view: RunView,
        steps: RunSteps | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.settings: Settings = config.settings
        self.view = view
        self.steps = steps or RunSteps(
            self.settings, environ, cache_root(self.settings.toolchain.cache_dir, environ)
        )  # fmt: skip
        self.run_dir = new_run_dir(out, config)
        self.run_id = self.run_dir.name
        run = self.settings.run
        self.state = RunState(
            self.run_dir, self.run_id, run.profile, self.settings.model.source, run.servers_at_once
        )  # fmt: skip
        write_run_config(self.run_dir, config)
        self.ports = RunPorts.pick(self.settings)
        self.cores = core_plan(self.settings.load.exclusive)
        self.dead_quants: set[str] = set()
        self.said_early: list[str] = []  # lines the run's end repeats (RunOutcome.again)
        self.on_gpu: dict[str, bool] = {}  # quant -> its server offloaded layers (offload check)
        self.context = RunContext(
            RunDir(self.run_dir), self.run_id, self.settings, warn=view.message,
            loadgen_port=self.ports.loadgen, cwd=cwd or Path.cwd(), environ=environ,
        )  # fmt: skip

    # ------------------------------------------------------------------ the sequence

    def execute(self) -> RunOutcome:
        """Run every step; children are stopped whatever happens (see the module docstring)."""
        status: RunStatus = "failed"
        report: ReportPaths | None = None
        try:
            with contextlib.ExitStack() as children:
                toolchain = self._required("toolchain", "llama.cpp tools", self.steps.toolchain)
                models = self._required(
                    "prepare", f"prepare {self.settings.model.source}",
                    lambda progress: self.steps.prepare(toolchain, self.run_dir, progress),
                    account=lambda prepared, _: (prepared.busy_s, None),
                )  # fmt: skip
                quants = models.quants()  # the manifest's order: largest file first
                self._preflight(toolchain, models, quants)
                self._quality(toolchain, models, quants)
                self._sensitivity(toolchain, models)
                self._speed(toolchain, models, quants)
                prometheus = self._prometheus(children)
                self._serve_and_load(toolchain, models, quants, prometheus)
                # Measuring is over. run.json says so before the report, which reads it: a report
                # of a run still "running" would call it unfinished. The report step is still
                # recorded in run.json after this.
                self.state.finish("finished")
                status = "finished"
                report = self._report(prometheus)
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            if self.state.status == "running":
                self.state.finish(status)
        return RunOutcome(self.run_dir, report, tuple(self.said_early))

    def _attempt(
        self,
        name: str,
        quant: str | None,
        title: str,
        body: Callable[[ProgressCallback], T],
        account: Account[T] = overhead,
        fatal: bool = False,
    ) -> T | Failed:
        """Run one step body, recorded in run.json; a QuantloadError becomes Failed (or, when
        `fatal`, ends the run); anything else is recorded and raised."""
        index = self.state.begin(name, quant)
        progress = self.view.step(title)
        started = time.monotonic()
        try:
            result = body(progress)
        except QuantloadError as error:
            self.state.end(index, "failed", error.one_line())
            self.view.message(f"{title} failed: {error.one_line()}")
            if fatal:
                raise
            return Failed(error.one_line())
        except BaseException as error:
            self.state.end(index, "failed", f"{type(error).__name__}: {error}")
            raise
        busy_s, problem = account(result, time.monotonic() - started)
        self.state.end(index, "failed" if problem else "ok", problem, busy_s)
        return result

    def _required(
        self,
        name: str,
        title: str,
        body: Callable[[ProgressCallback], T],
        account: Account[T] = measuring,
    ) -> T:
        """A step the run cannot go on without: its failure ends the run."""
        result = self._attempt(name, None, title, body, account, fatal=True)
        assert not isinstance(result, Failed)  # a fatal failure raised instead
        return result

    def _preflight(self, toolchain: Toolchain, models: PreparedModels, quants: Sequence[str]) -> None:
        """What the planned experiments (and the tune) check of their input, before any server
        starts: a bad input ends the run with its one line. RPC hosts and expert placement are
        checked against the devices llama-server sees (every host answers; a device besides the
        CPU to place experts away from)."""
        checked = [e for e in registry.planned(self.settings) if e.check is not no_check]
        server = self.settings.server
        placing = [("server.expert_placement", server.expert_placement)]
        if self.settings.run.tune:
            placing += [("tune.expert_placement", p) for p in self.settings.tune.expert_placement]
        asks_devices = bool(server.rpc) or any(placement_args(value) for _, value in placing)
        if not checked and not self.settings.run.tune and not asks_devices:
            return

        def check(progress: ProgressCallback) -> None:
            devices = self.steps.devices(toolchain) if asks_devices else None
            check_placement(placing, devices or ())
            found = Preflight(
                self.settings, self.steps.server_build(toolchain), {q: models.path(q) for q in quants},
                devices,
            )  # fmt: skip
            for experiment in checked:
                experiment.check(found)
            if self.settings.run.tune:
                self.steps.check_tune(found)

        self._required("preflight", "check the experiments' input", check, account=overhead)

    # ------------------------------------------------------------------ measuring files

    def _quality(self, toolchain: Toolchain, models: PreparedModels, quants: Sequence[str]) -> None:
        try:
            text = self.steps.quality_text()
        except QuantloadError as error:
            self.state.skip("quality", None, error.one_line())
            said = f"quality skipped: {error.one_line()}"
            self.view.message(said)
            self.said_early.append(said)
            return
        for quant in quants:
            measure = functools.partial(
                self.steps.quality, toolchain, models.path(quant), quant, text, self.run_dir
            )
            self._attempt("quality", quant, f"perplexity {quant}", measure, measuring)
        if not self.settings.quality.kld:
            return

        def attempt(title: str, label: str | None, body: Callable[[ProgressCallback], T]) -> T | None:
            result = self._attempt("kld", label, title, body, measuring)  # one step per run
            return None if isinstance(result, Failed) else result

        self.steps.kld(toolchain, models, quants, text, self.run_dir, attempt)

    def _sensitivity(self, toolchain: Toolchain, models: PreparedModels) -> None:
        """The sensitivity scan from the run's reference (sensitivity.in_run; needs KLD)."""
        if not (self.settings.sensitivity.in_run and self.settings.quality.kld):
            return
        reference = models.reference
        if reference is None:
            self.state.skip("sensitivity", None, "no F16, BF16 or F32 file to scan from")
            return
        try:
            text = self.steps.quality_text()
        except QuantloadError as error:
            self.state.skip("sensitivity", None, error.one_line())
            return
        reference_path = models.path(reference)
        scan = functools.partial(self.steps.sensitivity, toolchain, reference_path, text, self.run_dir)
        self._attempt("sensitivity", None, "sensitivity scan", scan, measuring)

    def _quiet(self, before: str, quant: str | None, server_pids: Sequence[int] = ()) -> None:
        """With load.exclusive: wait (at most load.quiet_wait_s) until other processes leave the
        machine, before `before`; how it went goes into the run's notes."""
        load = self.settings.load
        if not load.exclusive:
            return

        def wait(progress: ProgressCallback) -> None:
            said = wait_for_quiet(
                load.interference_cpu_frac, load.quiet_wait_s, server_pids,
                lambda line: progress(0, None, line),
            )  # fmt: skip
            if said.waited_s >= 3 or not said.quiet:
                self.state.note(said.sentence(before, load.interference_cpu_frac, load.quiet_wait_s))

        self._attempt("quiet", quant, f"wait for a quiet machine before {before}", wait)

    def _speed(self, toolchain: Toolchain, models: PreparedModels, quants: Sequence[str]) -> None:
        self._quiet("the machine limits probe and llama-bench", None)
        limits = self._attempt(
            "roofline_probe", None, "machine limits probe", lambda _: self.steps.probe(), measuring
        )  # fmt: skip
        if isinstance(limits, Failed):
            for quant in quants:
                self.state.fail_unrun("speed", quant, f"no machine limits: {limits.why}")
            return
        for quant in quants:
            measure = functools.partial(
                self.steps.speed, toolchain, models.path(quant), quant, limits, self.run_dir
            )
            self._attempt("speed", quant, f"llama-bench {quant}", measure, measuring)

    # ------------------------------------------------------------------ serving and load

    def _prometheus(self, children: contextlib.ExitStack) -> PrometheusProcess | None:
        """Prometheus for the whole load phase and the report; None (and why) when there is none."""
        why = self.steps.prometheus_missing()
        if why is not None:
            self.state.prometheus(False, None, why, None)
            self.view.message(f"Prometheus not used: {why}")
            return None
        exporter_url = f"http://{self.settings.observe.exporter_host}:{self.ports.exporter}"
        loadgen_urls = self.ports.loadgen_urls(self.settings, self.context.cwd)
        process = self.steps.prometheus(self.run_dir, exporter_url, loadgen_urls)
        children.callback(process.stop)
        started = self._attempt("prometheus", None, "start Prometheus", lambda _: process.start())
        if isinstance(started, Failed):
            why = f"Prometheus failed to start: {started.why}"
            self.state.prometheus(False, None, why, None)
            return None
        self.state.prometheus(True, process.url, None, str(process.folder))
        return process

    def _serve_and_load(
        self,
        toolchain: Toolchain,
        models: PreparedModels,
        quants: Sequence[str],
        prometheus: PrometheusProcess | None,
    ) -> None:
        with contextlib.ExitStack() as serving:
            exporter = self.steps.exporter(self.ports.exporter)  # one for the whole load phase
            serving.callback(exporter.stop)
            if self.settings.load.exclusive:
                self.state.note(f"--exclusive: {self.cores.why}")
            if self.cores.client_cpus is not None:  # the load client starts from this process
                before = pin_this_process(self.cores.client_cpus)
                if before is not None:
                    serving.callback(pin_this_process, before)
            if self.settings.run.servers_at_once:
                self.state.note("servers ran all at once (they shared this machine's cores)")
                served = [self._serve(toolchain, models, quant, serving) for quant in quants]
                started = [item for item in served if not isinstance(item, Failed)]
                self._watch(exporter, prometheus, started)
                self._idle_baseline(started)
                for item in started:
                    self._load(item, toolchain)
                return
            self.state.note("servers ran one at a time, so no server competed with another for cores")
            for quant in quants:
                with contextlib.ExitStack() as this_server:
                    one = self._serve(toolchain, models, quant, this_server)
                    if isinstance(one, Failed):
                        continue
                    self._watch(exporter, prometheus, [one])
                    this_server.callback(exporter.set_targets, [])
                    self._idle_baseline([one])
                    self._load(one, toolchain)

    def _serve(
        self, toolchain: Toolchain, models: PreparedModels, quant: str, stack: contextlib.ExitStack
    ) -> Served | Failed:
        """Start one quantization's server (stopped when `stack` closes) and check its KV cache."""
        server = self.steps.server(
            toolchain, models.path(quant), server_alias(models.model_name, quant), quant, self.run_dir
        )  # fmt: skip
        stack.callback(server.stop)
        log = str(server.log_path)
        started = self._attempt("serve", quant, f"start llama-server {quant}", lambda _: server.start())
        if isinstance(started, Failed):
            self.state.server(quant, log=log, status="failed_to_start")
            for name in ("kv", *(e.step for e in registry.planned(self.settings))):
                self.state.fail_unrun(name, quant, "llama-server did not start")
            return started
        self.state.server(quant, url=server.url, log=log, pid=server.pid, status="running")
        self._attempt(
            "kv", quant, f"KV check {quant}",
            lambda _: self.steps.check_kv(toolchain, server, quant, self.run_dir),
        )  # fmt: skip
        self._check_offload(server, quant)
        return Served(quant, server, name=server_name(quant), model=models.model_name)

    def _check_offload(self, server: LlamaServer, quant: str) -> None:
        """The layers on the GPU against server.gpu_layers (gpu.json); fewer than asked is said."""
        check = self._attempt(
            "offload", quant, f"GPU offload check {quant}",
            lambda _: self.steps.check_offload(server, quant, self.run_dir),
        )  # fmt: skip
        if isinstance(check, Failed):
            return
        self.on_gpu[quant] = check.on_gpu
        if check.verdict == "fewer than asked":
            self.view.message(f"llama-server {quant}: {check.line}")
            self.state.note(f"{quant}: {check.line}")

    def _idle_baseline(self, served: Sequence[Served]) -> None:
        """The GPUs watched idle before the load (observe.idle_baseline: auto = when a server
        offloaded layers)."""
        mode = self.settings.observe.idle_baseline
        if not served or mode == "off":
            return
        if mode == "auto" and not any(self.on_gpu.get(item.quant) for item in served):
            return
        quants = [item.quant for item in served]
        seconds = self.settings.observe.idle_baseline_s
        self._attempt(
            "idle_baseline", None, f"GPUs idle for {seconds:g} s (baseline)",
            lambda _: self.steps.idle_baseline(quants, self.run_dir),
        )  # fmt: skip

    def _watch(
        self, exporter: ExporterHandle, prometheus: PrometheusProcess | None, served: Sequence[Served]
    ) -> None:
        """Point the exporter at `served`; the load starts once Prometheus holds their series."""
        exporter.set_targets([item.exporter_target() for item in served])
        if prometheus is None:
            return
        prometheus.wait_scraping()
        for item in served:
            prometheus.wait_for_series(f'quantload_target_up{{server="{item.name}"}}')

    def _load(self, item: Served, toolchain: Toolchain) -> None:
        """Every planned experiment against one server; a server that dies fails the rest."""
        # a server running alone is restarted in place for a variant; beside the others, a second one
        in_place = not self.settings.run.servers_at_once
        servers = self.steps.server_variants(toolchain, item, self.run_dir, in_place)
        if self.settings.load.exclusive:
            pid = item.server.pid
            self._quiet(f"{item.quant}'s load", item.quant, [pid] if pid is not None else [])
        if self.settings.run.tune:
            self._tune(item, servers, toolchain)
        for experiment in registry.planned(self.settings):
            target = item.load_target()
            name, title = experiment.step, experiment.title.format(quant=item.quant)
            if item.quant in self.dead_quants:
                self.state.fail_unrun(name, item.quant, "llama-server died earlier in the run")
                continue
            run = functools.partial(self._experiment, experiment.name, target, servers)
            self._attempt(name, item.quant, title, run, experiment_account)
            if not item.server.alive():
                self.dead_quants.add(item.quant)
                self.state.server(item.quant, status="died", exit_code=item.server.stop())
                self.view.message(f"llama-server {item.quant} died; its remaining stages are marked failed")
        if item.quant not in self.dead_quants:
            self.state.server(item.quant, status="ok")

    def _tune(self, item: Served, servers: ServerControl, toolchain: Toolchain) -> None:
        """Tune the server's flags ([tune]) and serve the rest of the run with the winner's; a tune
        that fails or finds nothing leaves the configured flags (and says so)."""
        quant = item.quant
        tuned = self._attempt(
            "tune", quant, f"tune {quant}",
            lambda progress: self.steps.tune(item, servers, self.context.with_progress(progress), toolchain),
            account=lambda outcome, _: (outcome.busy_s, None),
        )  # fmt: skip
        if isinstance(tuned, Failed) or tuned.winner is None:
            why = (
                tuned.why
                if isinstance(tuned, Failed)
                else "no configuration was shown to beat the configured flags"
            )
            self.state.note(f"{quant}: tuning found no winner ({why}); served with the configured flags")
            return
        winner = tuned.winner
        adopted = self._attempt(
            "serve", quant, f"restart llama-server {quant} with the tuned flags",
            lambda _: self.steps.adopt(servers, winner, quant, self.run_dir),
        )  # fmt: skip
        if isinstance(adopted, Failed):
            self.state.note(f"{quant}: the tuned flags ({winner.key}) did not start: {adopted.why}")
            if not item.server.alive():
                self.dead_quants.add(quant)
            return
        self.state.note(f"{quant} served with the tuned flags {winner.key} (tune.jsonl, tune.json)")

    def _experiment(
        self, name: str, target: ServedTarget, servers: ServerControl, progress: ProgressCallback
    ) -> ExperimentRun:
        return self.steps.experiment(name, target, self.context.with_progress(progress), servers)

    def _report(self, prometheus: PrometheusProcess | None) -> ReportPaths | None:
        url = prometheus.url if prometheus is not None else None
        written = self._attempt("report", None, "report", lambda _: self.steps.report(self.run_dir, url))
        return None if isinstance(written, Failed) else written
