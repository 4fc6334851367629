"""`quantload run` as plain local processes: the named steps in order, every child supervised.

  toolchain -> prepare -> preflight (when an experiment or the tune checks its input)
  -> quality (per file) -> machine probe -> speed (per file) -> predict (per file: cost curves
  and the predicted limit, predict.enabled; a failure is recorded and the run goes on)
  -> Prometheus (when installed) -> per quantization: llama-server, KV check, [tune and serve
  with the winner's flags, with run.tune], the load experiments of `load.experiments`
  (quantload.experiments.registry; those that vary the server's flags run its variants), stop
  -> run.json "finished" -> report

The steps are `RunSteps`' (quantload.stack.run_steps: bound to the run's settings), which
tests replace with fakes. The run's folder, context, run.json, servers and experiments are the
run driver's (quantload.stack.run_driver), and so is the rule for a failure: a step that fails
with a QuantloadError is recorded "failed" and the run goes on, except those it cannot go on
without (toolchain, prepare, preflight) and a ConfigError in an experiment, whose error ends the
run. A llama-server that dies fails its quantization's remaining steps; the others still run.

Every child (llama-servers, the exporter, Prometheus) is entered into an ExitStack before it is
started, so it is stopped by its own handle on the way out whatever happens: a failure, a bug, or
an interruption (Ctrl-C, SIGTERM and SIGHUP all arrive as KeyboardInterrupt, see
quantload.cli.main). Killed outright, quantload takes them along too (quantload.childproc).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from quantload.analysis import ReportPaths
from quantload.config import ResolvedConfig, Settings
from quantload.errors import QuantloadError
from quantload.exclusive import core_plan, pin_this_process, wait_for_quiet
from quantload.experiments import registry
from quantload.experiments.base import Preflight, ServerControl, no_check
from quantload.exporter import ExporterHandle
from quantload.llamacpp.placement import check_placement, placement_args
from quantload.llamacpp.server import free_port
from quantload.llamacpp.toolchain import Toolchain
from quantload.load.calibration_file import machine_limits
from quantload.load.processes import most_workers
from quantload.models.prepared import PreparedModels
from quantload.observe.prometheus import PrometheusProcess
from quantload.paths import cache_root
from quantload.progress import ProgressCallback
from quantload.rundir.run_file import RunStatus
from quantload.stack.run_driver import (
    Failed,
    RunDriver,
    RunPlace,
    RunView,
    measuring,
    new_run_dir,
    overhead,
)
from quantload.stack.run_steps import RunSteps, Served

T = TypeVar("T")


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
        folder = new_run_dir(out, config)
        self.ports = RunPorts.pick(self.settings)
        place = RunPlace(folder, folder.name, cwd or Path.cwd(), environ, loadgen_port=self.ports.loadgen)
        self.driver = RunDriver(place, self.settings, view, self.steps, record=True)
        self.run_dir, self.run_id = self.driver.run_dir, self.driver.run_id
        self.state, self.context = self.driver.state, self.driver.context
        self.cores = core_plan(self.settings.load.exclusive)
        self.said_early: list[str] = []  # lines the run's end repeats (RunOutcome.again)

    # ------------------------------------------------------------------ the sequence

    def execute(self) -> RunOutcome:
        """Run every step; children are stopped whatever happens (see the module docstring)."""
        status: RunStatus = "failed"
        report: ReportPaths | None = None
        try:
            with contextlib.ExitStack() as children:
                toolchain = self.driver.required("toolchain", "llama.cpp tools", self.steps.toolchain)
                models = self.driver.required(
                    "prepare", f"prepare {self.settings.model.source}",
                    lambda progress: self.steps.prepare(toolchain, self.run_dir, progress),
                    account=lambda prepared, _: (prepared.busy_s, None),
                )  # fmt: skip
                quants = models.quants()  # the manifest's order: largest file first
                self._preflight(toolchain, models, quants)
                self._quality(toolchain, models, quants)
                self._sensitivity(toolchain, models)
                self._speed(toolchain, models, quants)
                self._predict(toolchain, models, quants)
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
            self.driver.finish(status)
        return RunOutcome(self.run_dir, report, tuple(self.said_early))

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

        self.driver.required("preflight", "check the experiments' input", check, account=overhead)

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
            self.driver.attempt("quality", quant, f"perplexity {quant}", measure, measuring)
        if not self.settings.quality.kld:
            return

        def attempt(title: str, label: str | None, body: Callable[[ProgressCallback], T]) -> T | None:
            result = self.driver.attempt("kld", label, title, body, measuring)  # one step per run
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
        self.driver.attempt("sensitivity", None, "sensitivity scan", scan, measuring)

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

        self.driver.attempt("quiet", quant, f"wait for a quiet machine before {before}", wait)

    def _speed(self, toolchain: Toolchain, models: PreparedModels, quants: Sequence[str]) -> None:
        self._quiet("the machine limits probe and llama-bench", None)
        limits = self.driver.attempt(
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
            self.driver.attempt("speed", quant, f"llama-bench {quant}", measure, measuring)

    def _predict(self, toolchain: Toolchain, models: PreparedModels, quants: Sequence[str]) -> None:
        """Each file's limit predicted before any load (predict.json), for the report to set beside
        what the load measures. Nothing here stops the run: turned off, or a workload the model
        does not predict, is recorded skipped with why; a tool that fails, that file's step failed."""
        if not self.settings.predict.enabled:
            self.state.skip("predict", None, "turned off (predict.enabled = false)")
            return
        try:
            shapes = self.steps.predict_workload(self.context.cwd)
        except QuantloadError as error:
            self.state.skip("predict", None, error.one_line())
            self.view.message(f"prediction skipped: {error.one_line()}")
            return
        self._quiet("the prediction's llama-batched-bench", None)
        for quant in quants:
            measure = functools.partial(
                self.steps.predict, toolchain, models.path(quant), quant, shapes, self.run_dir
            )
            self.driver.attempt("predict", quant, f"predict {quant}", measure, measuring)

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
        started = self.driver.attempt("prometheus", None, "start Prometheus", lambda _: process.start())
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
        planned = [experiment.step for experiment in registry.planned(self.settings)]
        return self.driver.serve(toolchain, models, quant, stack, then=planned)

    def _idle_baseline(self, served: Sequence[Served]) -> None:
        """The GPUs watched idle before the load (observe.idle_baseline: auto = when a server
        offloaded layers)."""
        mode = self.settings.observe.idle_baseline
        if not served or mode == "off":
            return
        if mode == "auto" and not any(self.driver.on_gpu.get(item.quant) for item in served):
            return
        quants = [item.quant for item in served]
        seconds = self.settings.observe.idle_baseline_s
        self.driver.attempt(
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
        target = item.load_target()
        self.driver.run_experiments(target, registry.planned(self.settings), servers, item.server)
        if not self.driver.is_gone(target):
            self.state.server(item.quant, status="ok")

    def _tune(self, item: Served, servers: ServerControl, toolchain: Toolchain) -> None:
        """Tune the server's flags ([tune]) and serve the rest of the run with the winner's; a tune
        that fails or finds nothing leaves the configured flags (and says so)."""
        quant = item.quant
        tuned = self.driver.attempt(
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
        adopted = self.driver.attempt(
            "serve", quant, f"restart llama-server {quant} with the tuned flags",
            lambda _: self.steps.adopt(servers, winner, quant, self.run_dir),
        )  # fmt: skip
        if isinstance(adopted, Failed):
            self.state.note(f"{quant}: the tuned flags ({winner.key}) did not start: {adopted.why}")
            self.driver.check_alive(item.load_target(), item.server)
            return
        self.state.note(f"{quant} served with the tuned flags {winner.key} (tune.jsonl, tune.json)")

    def _report(self, prometheus: PrometheusProcess | None) -> ReportPaths | None:
        url = prometheus.url if prometheus is not None else None
        written = self.driver.attempt(
            "report", None, "report", lambda _: self.steps.report(self.run_dir, url)
        )
        return None if isinstance(written, Failed) else written
