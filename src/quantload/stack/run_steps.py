"""The steps of one native run bound to its settings (what `NativeRun` calls), and a served target.

`RunSteps` turns the run's settings into the arguments of each named step (quantload.steps) and
of each child the run starts (llama-server, the exporter, Prometheus), with run-directory file
names filled in, and hands out the control of each started server's variants (other flags, for
the experiments that vary them). Tests of the orchestrator subclass it with fakes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import SecretStr

from quantload.analysis import ReportPaths
from quantload.config import Settings
from quantload.exclusive import core_plan
from quantload.experiments.base import (
    ExperimentContext,
    ExperimentRun,
    Preflight,
    ServedVariant,
    ServerControl,
)
from quantload.exporter import ExporterHandle, ExporterTarget, start_exporter
from quantload.kvcheck import KvCheck, merge_kv_file
from quantload.llamacpp.devices import Device, list_devices
from quantload.llamacpp.offload import OffloadCheck
from quantload.llamacpp.quant_types import quant_types
from quantload.llamacpp.server import LlamaServer
from quantload.llamacpp.server_help import ServerBuild, server_build
from quantload.llamacpp.toolchain import Toolchain, ensure_toolchain
from quantload.observe.prometheus import PrometheusProcess, prometheus_missing
from quantload.progress import ProgressCallback
from quantload.quality.kld_measure import RunAttempt, measure_manifest_kld
from quantload.quality.kld_results import KldSet
from quantload.quality.results import QualityResult
from quantload.quality.sensitivity import SensitivityFile, scan_sensitivity
from quantload.roofline.probe import MachineLimits
from quantload.roofline.speed_file import SpeedEntry
from quantload.run_context import RunContext
from quantload.rundir.gpu_file import IdleWindow
from quantload.rundir.handle import RunDir
from quantload.served import ServedTarget
from quantload.stack.server_variants import ServerVariants
from quantload.steps.load import run_experiment
from quantload.steps.prepare import (
    PreparedModels,
    prepare_model_files,
    prepared_folder,
    scored_text_on_disk,
)
from quantload.steps.quality import measure_file_quality, quality_text
from quantload.steps.report import write_report
from quantload.steps.serve import check_kv, check_server_offload, server_spec, watch_idle
from quantload.steps.speed import measure_file_speed, probe
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
        return quality_text(self.settings.quality, self.cache, self.environ)

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
        return probe(self.cache, self.settings.speed)

    def speed(
        self, toolchain: Toolchain, model: Path, quant: str, limits: MachineLimits, run_dir: Path,
        progress: ProgressCallback,
    ) -> SpeedEntry:  # fmt: skip
        files = RunDir(run_dir)
        return measure_file_speed(
            toolchain, model, self.settings.speed, limits, quant, progress, files.speed_path,
            files.log_path(f"llama-bench-{quant}.log"),
        )  # fmt: skip

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
        spec = server_spec(self.settings.server, model, alias, slot_save_path=files.slots_path)
        spec = dataclasses.replace(spec, cpus=core_plan(self.settings.load.exclusive).server_cpus)
        log_path = files.log_path(f"llama-server-{quant}.log")
        return LlamaServer(toolchain, spec, log_path, self.settings.server.startup_timeout_s)

    def check_kv(self, toolchain: Toolchain, server: LlamaServer, quant: str, run_dir: Path) -> KvCheck:
        return check_kv(server, quant, RunDir(run_dir).kv_path, toolchain.version_record())

    def check_offload(self, server: LlamaServer, quant: str, run_dir: Path) -> OffloadCheck:
        return check_server_offload(server, quant, RunDir(run_dir).gpu_path)

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
        return write_report(run_dir, self.settings, prometheus_url)


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
