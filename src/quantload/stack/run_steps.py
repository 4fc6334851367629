"""The named steps of the protocol, bound to one run's settings (what `NativeRun` calls), and a
served target.

`RunSteps` is the one seam between the run and the work: each method is one step with typed
inputs and a typed result, its settings and run-directory file names filled in, calling the
module of its domain; tests of the orchestrator subclass it with fakes. A step that cannot produce
its result raises a QuantloadError (its typed failure: ModelError, ServerError, MeasurementError,
...). Each subcommand calls the same domain function as its step here, so a step has one
implementation and each run-directory file one writer.

  prepare  the files of one model, their manifest (quantload.models.prepared)   -> PreparedModels
  quality  perplexity of one file on WikiText-2, quality.json (quantload.quality.measure)
                                                                                 -> QualityResult
  speed    the machine's roofline probe (quantload.roofline.probe); llama-bench of one file,
           speed.json (quantload.roofline.measure)                               -> SpeedEntry
  predict  the workload's request shapes (quantload.predict.workload_shapes); one file's cost
           curves, costs-<quant>.json, and its predicted limit added to predict.json
           (quantload.predict.in_run)                                            -> FilePrediction
  serve    a llama-server of one file (quantload.llamacpp.server); its KV cache checked, kv.json
           (quantload.kvcheck); its layers' placement, gpu.json (llamacpp.offload) -> LlamaServer, KvCheck
  load     one load experiment against a served target (experiments.registry) -> ExperimentRun
  report   the report of a run directory (quantload.analysis)                 -> ReportPaths

It also starts each child the run needs besides (the exporter, Prometheus) and hands out the
control of each started server's variants (other flags, for the experiments that vary them).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from quantload.analysis import ReportPaths, build_report
from quantload.config import Settings
from quantload.exclusive import core_plan
from quantload.experiments.base import (
    ExperimentContext,
    ExperimentRun,
    Preflight,
    ServedVariant,
    ServerControl,
)
from quantload.experiments.registry import run_experiment
from quantload.exporter import ExporterHandle, ExporterTarget, start_exporter
from quantload.kvcheck import KvCheck, check_kv, merge_kv_file
from quantload.llamacpp.devices import Device, list_devices
from quantload.llamacpp.offload import OffloadCheck, check_offload, parse_offload
from quantload.llamacpp.quant_types import quant_types
from quantload.llamacpp.server import LlamaServer, ServerSpec
from quantload.llamacpp.server_help import ServerBuild, server_build
from quantload.llamacpp.toolchain import Toolchain, ensure_toolchain
from quantload.models.prepared import (
    PreparedModels,
    prepare_model_files,
    prepared_folder,
    scored_text_on_disk,
)
from quantload.observe.prometheus import PrometheusProcess, prometheus_missing
from quantload.predict.in_run import predict_in_run
from quantload.predict.prediction import FilePrediction
from quantload.predict.workload_shapes import WorkloadShapes, workload_shapes
from quantload.progress import ProgressCallback
from quantload.quality.dataset import resolve_dataset
from quantload.quality.kld_measure import RunAttempt, measure_manifest_kld
from quantload.quality.kld_results import KldSet
from quantload.quality.measure import measure_file_quality
from quantload.quality.results import QualityResult
from quantload.quality.sensitivity import SensitivityFile, scan_sensitivity
from quantload.roofline.measure import measure_file_speed
from quantload.roofline.probe import MachineLimits, probe_in_cache
from quantload.roofline.speed_file import SpeedEntry
from quantload.run_context import RunContext
from quantload.rundir.gpu_file import IdleWindow, merge_offload, watch_idle
from quantload.rundir.handle import RunDir
from quantload.served import ServedTarget
from quantload.stack.server_variants import ServerVariants
from quantload.tune.outcome import quant_summary, write_tune_json
from quantload.tune.search import TuneOutcome, tune_quant
from quantload.tune.space import TuneConfig, check_space, model_identity


class RunSteps:
    """The steps of one run, bound to its settings. Tests override methods with fakes."""

    def __init__(self, settings: Settings, environ: Mapping[str, str], cache: Path) -> None:
        self.settings = settings
        self.environ = environ
        self.cache = cache
        self.watching: ExporterHandle | None = None  # the exporter `exporter` started, told of restarts

    def toolchain(self, progress: ProgressCallback) -> Toolchain:
        return ensure_toolchain(
            self.settings.toolchain, self.environ, progress, gpu_layers=self.settings.server.gpu_layers
        )

    def prepare(self, toolchain: Toolchain, run_dir: Path, progress: ProgressCallback) -> PreparedModels:
        prepare = self.settings.prepare
        # the user's own files stay where they are: their manifest is the run's
        folder = run_dir if prepare.files else prepared_folder(self.cache, self.settings.model.source)
        return prepare_model_files(
            self.settings.model, self.settings.toolchain, toolchain, self.cache, self.environ,
            folder, progress, run_dir=run_dir, prepare=prepare,
            scored_text=scored_text_on_disk(self.settings.quality, self.cache),
        )  # fmt: skip

    def quality_text(self) -> Path:
        """The text to score: the configured file, else WikiText-2 from the cache or the network;
        a QuantloadError saying how to provide it when there is none (offline, no path)."""
        return resolve_dataset(self.settings.quality.dataset, self.cache, self.environ)

    def quality(
        self, toolchain: Toolchain, model: Path, quant: str, text: Path, run_dir: Path,
        progress: ProgressCallback,
    ) -> QualityResult:  # fmt: skip
        files = RunDir(run_dir)
        return measure_file_quality(
            toolchain, model, text, self.settings.quality, quant, progress, files.quality_path,
            files.log_path(f"llama-perplexity-{quant}.log"),
        )  # fmt: skip

    def kld(
        self, toolchain: Toolchain, models: PreparedModels, quants: Sequence[str], text: Path,
        run_dir: Path, attempt: RunAttempt,
    ) -> KldSet | None:  # fmt: skip
        files = RunDir(run_dir)
        return measure_manifest_kld(
            toolchain, models.manifest, quants, text, self.cache, self.settings.quality,
            files.quality_path, attempt, files.logs_path,
        )  # fmt: skip

    def sensitivity(
        self, toolchain: Toolchain, reference: Path, text: Path, run_dir: Path, progress: ProgressCallback
    ) -> SensitivityFile:
        settings = self.settings
        return scan_sensitivity(
            toolchain, reference, text, self.cache, settings.quality, settings.sensitivity,
            settings.report.max_kld_mean_nats, quant_types(toolchain), run_dir, progress,
            RunDir(run_dir).logs_path,
        )  # fmt: skip

    def probe(self) -> MachineLimits:
        return probe_in_cache(self.cache, self.settings.speed)

    def speed(
        self, toolchain: Toolchain, model: Path, quant: str, limits: MachineLimits, run_dir: Path,
        progress: ProgressCallback,
    ) -> SpeedEntry:  # fmt: skip
        files = RunDir(run_dir)
        return measure_file_speed(
            toolchain, model, self.settings.speed, limits, quant, progress, files.speed_path,
            files.log_path(f"llama-bench-{quant}.log"),
        )  # fmt: skip

    def predict_workload(self, cwd: Path) -> WorkloadShapes:
        """What the load will send, in tokens; a ConfigError for a workload kind not predicted."""
        return workload_shapes(self.settings, cwd)

    def predict(
        self, toolchain: Toolchain, model: Path, quant: str, shapes: WorkloadShapes, run_dir: Path,
        progress: ProgressCallback,
    ) -> FilePrediction:  # fmt: skip
        return predict_in_run(toolchain, model, quant, self.settings, shapes, run_dir, progress)

    def prometheus_missing(self) -> str | None:
        return prometheus_missing(self.settings.observe.prometheus_binary)

    def prometheus(self, run_dir: Path, exporter_url: str, loadgen_urls: Sequence[str]) -> PrometheusProcess:
        observe = self.settings.observe
        return PrometheusProcess(
            run_dir, exporter_url, loadgen_urls, observe.scrape_interval_s,
            binary=observe.prometheus_binary, port=observe.prometheus_port,
        )  # fmt: skip

    def server(self, toolchain: Toolchain, model: Path, alias: str, quant: str, run_dir: Path) -> LlamaServer:
        files = RunDir(run_dir)  # its slots folder lets the run erase slots between experiments
        spec = dataclasses.replace(
            ServerSpec.from_settings(self.settings.server, model, alias),
            slot_save_path=files.slots_path,
            cpus=core_plan(self.settings.load.exclusive).server_cpus,
        )
        log_path = files.log_path(f"llama-server-{quant}.log")
        return LlamaServer(toolchain, spec, log_path, self.settings.server.startup_timeout_s)

    def check_kv(self, toolchain: Toolchain, server: LlamaServer, quant: str, run_dir: Path) -> KvCheck:
        return check_kv(server, quant, RunDir(run_dir).kv_path, toolchain.version_record())

    def check_offload(self, server: LlamaServer, quant: str, run_dir: Path) -> OffloadCheck:
        """The layers the server was asked to put on the GPU against those its latest launch
        logged, filed in gpu.json under `quant`."""
        check = check_offload(server.spec.gpu_layers, parse_offload(server.launch_log_text()))
        merge_offload(RunDir(run_dir).gpu_path, quant, check)
        return check

    def idle_baseline(self, quants: Sequence[str], run_dir: Path) -> IdleWindow:
        return watch_idle(quants, self.settings.observe.idle_baseline_s, RunDir(run_dir).gpu_path)

    def exporter(self, port: int) -> ExporterHandle:
        observe = self.settings.observe
        self.watching = start_exporter(
            [], port=port, timeout_s=observe.exporter_timeout_s, host=observe.exporter_host
        )
        return self.watching

    def experiment(
        self, experiment: str, target: ServedTarget, context: RunContext, servers: ServerControl | None
    ) -> ExperimentRun:
        return run_experiment(experiment, target, context, servers)

    def server_variants(
        self, toolchain: Toolchain, served: Served, run_dir: Path, in_place: bool
    ) -> ServerControl:
        """Variants of `served`'s server with other flags (restarted in place when it runs alone)."""
        planned = self.watching.restarting if self.watching is not None else None
        return ServerVariants(
            served.server, served.load_target(), toolchain, RunDir(run_dir).logs_path, in_place, planned
        )

    def server_build(self, toolchain: Toolchain) -> ServerBuild:
        return server_build(toolchain)

    def devices(self, toolchain: Toolchain) -> tuple[Device, ...]:
        """The devices the run's llama-servers see besides the CPU (its RPC hosts included)."""
        return list_devices(toolchain, self.settings.server.rpc)

    def check_tune(self, preflight: Preflight) -> None:
        check_space(preflight.settings, preflight.build, preflight.models, preflight.devices)

    def tune(
        self, served: Served, servers: ServerControl, context: RunContext, toolchain: Toolchain
    ) -> TuneOutcome:
        """Tune `served`'s flags ([tune]); its outcome goes to tune.jsonl and tune.json."""
        spec = served.server.spec
        model = model_identity(self.settings.model.source, spec.model_path)
        outcome = tune_quant(ExperimentContext(context, served.load_target(), servers), model=model)
        summary = quant_summary(
            outcome, spec, self.settings, toolchain.path("llama-server"), spec.model_path.stat().st_size,
            served.server.port,
        )  # fmt: skip
        write_tune_json(context.run_dir.path, served.quant, summary)
        return outcome

    def adopt(self, servers: ServerControl, config: TuneConfig, quant: str, run_dir: Path) -> ServedVariant:
        """Serve the rest of the run with `config`'s flags; its KV check replaces the quantization's."""
        adopted = servers.adopt(config.server_flags(self.settings, f"tuned {config.key}"))
        merge_kv_file(RunDir(run_dir).kv_path, quant, adopted.kv or adopted.kv_error or "not checked")
        return adopted

    def report(self, run_dir: Path, prometheus_url: str | None) -> ReportPaths:
        """The report of `run_dir` (report.md, report.html, table.csv, summary.json, plots);
        without `prometheus_url` it reopens the run's saved Prometheus data when it can."""
        settings = self.settings
        return build_report(
            run_dir, prometheus_url, settings.report, None, settings.observe.prometheus_binary,
            plan=settings.plan,
        )  # fmt: skip


@dataclass(frozen=True)
class Served:
    """A started llama-server and the names its series and records go by."""

    quant: str
    server: LlamaServer
    name: str
    model: str

    def load_target(self) -> ServedTarget:
        key = self.server.spec.api_key
        return ServedTarget(
            name=self.name, quant=self.quant, model=self.model, url=self.server.url,
            api_key=SecretStr(key) if key else None,
        )  # fmt: skip

    def exporter_target(self) -> ExporterTarget:
        return ExporterTarget.of(self.load_target(), log_path=self.server.log_path)
