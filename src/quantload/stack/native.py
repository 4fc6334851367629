"""`quantload run` as plain local processes: the whole protocol, one step after another.

prepare -> quality -> speed and roofline -> for each quantization: start its llama-server,
KV check, load stages, prompt-cache experiment, stop it -> report. The exporter and Prometheus
run for the whole load phase when the `prometheus` binary is present.

Every child (llama-server, Locust, Prometheus) is stopped by its own handle on the way out,
whatever happened; `run.json` says how far the run got, so `quantload report` works on a stopped
run too. A server that dies marks its quantization's remaining steps failed and the run moves on.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from quantload.config import ResolvedConfig, Settings, describe
from quantload.errors import QuantloadError
from quantload.kvcache import kv_shape_from_gguf, predict_kv
from quantload.kvcheck import KvCheck, kv_check_from_log, kv_file_payload
from quantload.llamacpp.server import LlamaServer, ServerSpec, free_port
from quantload.llamacpp.toolchain import Toolchain, ensure_llama_source, ensure_toolchain
from quantload.models.gguf_meta import read_gguf
from quantload.models.manifest import Manifest, save_manifest
from quantload.models.prepare import prepare_models
from quantload.paths import cache_root
from quantload.progress import ProgressCallback
from quantload.rundir import (
    CONFIG_JSON,
    KV_JSON,
    LOGS_DIR,
    MANIFEST_JSON,
    QUALITY_JSON,
    SPEED_JSON,
    STAGES_JSONL,
    make_run_id,
    write_json_atomic,
)
from quantload.stack.run_state import RunState

PREPARED_DIR = "prepared"
SLOTS_DIR = "slots"  # llama-server --slot-save-path: lets the run erase slots between experiments


class RunView(Protocol):
    """How the run shows itself: one step at a time, each with its own progress."""

    def step(self, title: str) -> ProgressCallback:
        """A new step begins; the returned callback reports its progress."""
        ...

    def message(self, text: str) -> None:
        """A line worth showing between steps."""
        ...


@dataclass
class _Served:
    """A running llama-server of one quantization."""

    quant: str
    server: LlamaServer


@dataclass
class _Children:
    """Everything the run started, so it can all be stopped on the way out."""

    servers: dict[str, LlamaServer] = field(default_factory=dict)
    exporter: Any = None
    prometheus: Any = None

    def stop_servers(self) -> None:
        for server in self.servers.values():
            server.stop()
        self.servers.clear()

    def stop_exporter(self) -> None:
        if self.exporter is not None:
            self.exporter.stop()
            self.exporter = None

    def stop_all(self) -> None:
        self.stop_servers()
        self.stop_exporter()
        if self.prometheus is not None:
            self.prometheus.stop()
            self.prometheus = None


def new_run_dir(out: Path, config: ResolvedConfig) -> tuple[Path, str]:
    """A fresh folder `out/<run-id>`; never an existing one, so a finished run is never overwritten."""
    config_json = config.settings.model_dump(mode="json")
    run_id = make_run_id(config_json)
    run_dir = out / run_id
    suffix = 1
    while run_dir.exists():
        suffix += 1
        run_dir = out / f"{run_id}-{suffix}"
    run_dir.mkdir(parents=True)
    (run_dir / LOGS_DIR).mkdir()
    return run_dir, run_dir.name


def _config_payload(config: ResolvedConfig) -> dict[str, Any]:
    return {
        "settings": config.settings.model_dump(mode="json"),
        "sources": {key: source for key, _, source in describe(config)},
    }


def _stage_busy_seconds(stages_path: Path, stage_ids: Sequence[str]) -> float:
    """Wall time spent inside the given stages, from their start and end lines."""
    from quantload.load.records import iter_stage_events

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


class NativeRun:
    """One run of the whole protocol on this machine."""

    def __init__(
        self,
        config: ResolvedConfig,
        environ: Mapping[str, str],
        out: Path,
        view: RunView,
    ) -> None:
        self.config = config
        self.settings: Settings = config.settings
        self.environ = environ
        self.view = view
        self.cache = cache_root(self.settings.toolchain.cache_dir, environ)
        self.run_dir, self.run_id = new_run_dir(out, config)
        self.state = RunState(
            self.run_dir,
            self.run_id,
            self.settings.run.profile,
            self.settings.model.source,
            self.settings.run.servers_at_once,
        )
        write_json_atomic(self.run_dir / CONFIG_JSON, _config_payload(config))
        self.children = _Children()
        self.kv_checks: dict[str, KvCheck | str] = {}
        self.dead_quants: set[str] = set()

    # ------------------------------------------------------------------ the whole run

    def execute(self) -> Path:
        """Run every step; return the run directory. Children are stopped whatever happens."""
        status = "failed"
        try:
            toolchain = self._toolchain()
            manifest = self._prepare(toolchain)
            self._quality(toolchain, manifest)
            self._speed(toolchain, manifest)
            self._serve_and_load(toolchain, manifest)
            self.children.stop_servers()
            self.children.stop_exporter()
            status = "finished"
            self.state.finish("finished")
            self._report()
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            self.children.stop_all()
            if self.state.data["status"] == "running":
                self.state.finish(status)  # type: ignore[arg-type]
        return self.run_dir

    @contextlib.contextmanager
    def _step(self, name: str, quant: str | None = None, title: str = "") -> Iterator[_StepContext]:
        index = self.state.begin(name, quant)
        context = _StepContext(self.view.step(title or f"{name} {quant or ''}".strip()))
        try:
            yield context
        except QuantloadError as error:
            self.state.end(index, "failed", error.one_line(), context.busy_seconds)
            self.view.message(f"{name} {quant or ''} failed: {error.one_line()}")
            if context.fatal:
                raise
            return
        except BaseException as error:
            self.state.end(index, "failed", f"{type(error).__name__}: {error}", context.busy_seconds)
            raise
        self.state.end(index, context.status, context.error, context.busy_seconds)

    # ------------------------------------------------------------------ steps

    def _toolchain(self) -> Toolchain:
        with self._step("toolchain", title="llama.cpp tools") as step:
            step.fatal = True
            toolchain = ensure_toolchain(self.settings.toolchain, self.environ, step.progress)
            self.state.note(f"llama.cpp: {toolchain.label} ({toolchain.binary_version})")
        return toolchain

    def _prepare(self, toolchain: Toolchain) -> Manifest:
        source = self.settings.model.source
        folder = self.cache / PREPARED_DIR / _folder_name(source)
        result: list[Manifest] = []
        with self._step("prepare", title=f"prepare {source}") as step:
            step.fatal = True
            started = time.monotonic()
            manifest = prepare_models(
                source,
                folder,
                toolchain,
                self.cache,
                self.environ,
                functools.partial(ensure_llama_source, self.settings.toolchain, self.environ),
                quants=self.settings.model.quants,
                tiny_seed=self.settings.model.tiny_seed,
                progress=step.progress,
            )
            step.busy_seconds = time.monotonic() - started
            save_manifest(self.run_dir / MANIFEST_JSON, _absolute(manifest, folder))
            _copy_logs(folder / LOGS_DIR, self.run_dir / LOGS_DIR, prefix="prepare-")
            result.append(manifest)
        return _absolute(result[0], folder)

    def _quants(self, manifest: Manifest) -> list[str]:
        """The quantizations asked for, in the order asked (the manifest also holds the F16 base)."""
        return [quant for quant in self.settings.model.quants if quant in manifest.files]

    def _quality(self, toolchain: Toolchain, manifest: Manifest) -> None:
        from quantload.quality.dataset import resolve_dataset
        from quantload.quality.measure import measure_quality
        from quantload.quality.results import save_quality_result

        quality = self.settings.quality
        try:
            dataset = resolve_dataset(quality.dataset, self.cache, self.environ)
        except QuantloadError as error:
            self.state.skip("quality", None, error.one_line())
            self.view.message(f"quality skipped: {error.one_line()}")
            return
        for quant in self._quants(manifest):
            entry = manifest.files[quant]
            with self._step("quality", quant, f"perplexity {quant}") as step:
                started = time.monotonic()
                result = measure_quality(
                    toolchain, Path(entry.path), dataset, quality.ctx, quality.chunks, step.progress,
                    threads=quality.threads, timeout_s=quality.timeout_s,
                    log_path=self.run_dir / LOGS_DIR / f"llama-perplexity-{quant}.log",
                )
                step.busy_seconds = time.monotonic() - started
                save_quality_result(self.run_dir / QUALITY_JSON, quant, result)
        if not quality.kld:
            return
        from quantload.quality.kld_measure import measure_manifest_kld

        @contextlib.contextmanager
        def kld_step(title: str, label: str) -> Iterator[ProgressCallback]:
            with self._step("kld", None if label == "base" else label, title) as step:
                started = time.monotonic()
                yield step.progress
                step.busy_seconds = time.monotonic() - started

        measure_manifest_kld(
            toolchain, manifest, self._quants(manifest), dataset, self.cache, quality,
            self.run_dir / QUALITY_JSON, kld_step, self.run_dir / LOGS_DIR,
        )  # fmt: skip

    def _speed(self, toolchain: Toolchain, manifest: Manifest) -> None:
        from quantload.llamacpp.bench import measure_speed
        from quantload.roofline.ceilings import roofline
        from quantload.roofline.probe import probe_machine
        from quantload.roofline.speed_file import SpeedEntry, save_speed_entry

        speed = self.settings.speed
        with self._step("roofline_probe", title="machine limits probe") as step:
            started = time.monotonic()
            limits = probe_machine(self.cache / "machine", max_age_s=speed.probe_max_age_s)
            step.busy_seconds = time.monotonic() - started
        for quant in self._quants(manifest):
            entry = manifest.files[quant]
            with self._step("speed", quant, f"llama-bench {quant}") as step:
                started = time.monotonic()
                bench = measure_speed(
                    toolchain, Path(entry.path), speed.prompt_tokens, speed.gen_tokens, speed.reps,
                    speed.threads, step.progress, timeout_s=speed.timeout_s,
                    log_path=self.run_dir / LOGS_DIR / f"llama-bench-{quant}.log",
                )
                step.busy_seconds = time.monotonic() - started
                summary = read_gguf(Path(entry.path))
                save_speed_entry(
                    self.run_dir / SPEED_JSON, quant,
                    SpeedEntry(bench=bench, roofline=roofline(bench, summary, limits)), limits,
                )

    # ------------------------------------------------------------------ serving and load

    def _load_settings(self) -> Any:
        return self.settings.load.model_copy(update={"metrics_port": self.loadgen_port, "workers": 0})

    def _serve_and_load(self, toolchain: Toolchain, manifest: Manifest) -> None:
        self.exporter_port = free_port(self.settings.observe.exporter_host)
        self.loadgen_port = free_port(self.settings.load.metrics_host)
        self._start_prometheus()
        quants = self._quants(manifest)
        if self.settings.run.servers_at_once:
            self.state.note("servers ran all at once (they shared this machine's cores)")
            served = [s for s in (self._start_server(toolchain, manifest, q) for q in quants) if s]
            self._start_exporter(served)
            for item in served:
                self._load_one(item)
            self.children.stop_exporter()
            self.children.stop_servers()
        else:
            self.state.note("servers ran one at a time, so they did not compete for cores")
            for quant in quants:
                one = self._start_server(toolchain, manifest, quant)
                if one is None:
                    continue
                self._start_exporter([one])  # one exporter for the whole load phase, retargeted
                try:
                    self._load_one(one)
                finally:
                    if self.children.exporter is not None:
                        self.children.exporter.set_targets([])
                    one.server.stop()
                    self.children.servers.pop(quant, None)
            self.children.stop_exporter()

    def _start_prometheus(self) -> None:
        from quantload.stack.prometheus import PrometheusProcess

        observe = self.settings.observe
        if shutil.which(observe.prometheus_binary) is None:
            why = (
                f"the '{observe.prometheus_binary}' binary is not installed (Debian/Ubuntu: "
                "apt-get install prometheus; macOS: brew install prometheus)"
            )
            self.state.prometheus(False, None, why, None)
            self.view.message(f"Prometheus not used: {why}")
            return
        exporter_url = f"http://{observe.exporter_host}:{self.exporter_port}"
        loadgen_url = f"http://{self.settings.load.metrics_host}:{self.loadgen_port}"
        with self._step("prometheus", title="start Prometheus") as step:
            process = PrometheusProcess(
                self.run_dir, exporter_url, [loadgen_url], observe.scrape_interval_s,
                binary=observe.prometheus_binary, port=observe.prometheus_port,
            )
            process.start()
            self.children.prometheus = process
            self.state.prometheus(True, process.url, None, str(process.folder))
            step.progress(1, 1, process.url)
        if self.children.prometheus is None:
            self.state.prometheus(False, None, "Prometheus failed to start (see logs/prometheus.log)", None)

    def _start_server(self, toolchain: Toolchain, manifest: Manifest, quant: str) -> _Served | None:
        entry = manifest.files[quant]
        model_path = Path(entry.path)
        alias = f"{manifest.source.get('name', 'model')}-{quant}"
        log_path = self.run_dir / LOGS_DIR / f"llama-server-{quant}.log"
        spec = dataclasses.replace(
            ServerSpec.from_settings(self.settings.server, model_path, alias),
            slot_save_path=self.run_dir / SLOTS_DIR,
        )
        server = LlamaServer(toolchain, spec, log_path, self.settings.server.startup_timeout_s)
        started: list[_Served] = []
        with self._step("serve", quant, f"start llama-server {quant}") as step:
            server.start()
            self.children.servers[quant] = server
            self.state.server(quant, url=server.url, log=str(log_path), pid=server.pid, status="running")
            step.progress(1, 1, server.url)
            started.append(_Served(quant, server))
        if not started:
            self.state.server(quant, log=str(log_path), status="failed_to_start")
            self._mark_rest_failed(quant, "llama-server did not start")
            return None
        with self._step("kv", quant, f"KV check {quant}"):
            prediction = predict_kv(
                kv_shape_from_gguf(read_gguf(model_path)),
                spec.slots, spec.ctx_per_slot, spec.cache_type_k, spec.cache_type_v, spec.kv_unified,
            )
            try:
                self.kv_checks[quant] = kv_check_from_log(prediction, server.log_text(), log_path)
            except QuantloadError as error:
                self.kv_checks[quant] = error.one_line()
                raise
            finally:
                payload = kv_file_payload(self.kv_checks, toolchain.version_record())
                write_json_atomic(self.run_dir / KV_JSON, payload)
        return started[0]

    def _start_exporter(self, served: Sequence[_Served]) -> None:
        from quantload.exporter import Target as ExporterTarget
        from quantload.exporter import start_exporter

        observe = self.settings.observe
        targets = [
            ExporterTarget(
                name=f"llama-{item.quant.lower()}",
                url=item.server.url,
                quant=item.quant,
                model=item.server.spec.alias.rsplit("-", 1)[0],
                api_key=item.server.spec.api_key,
                log_path=item.server.log_path,
            )
            for item in served
        ]
        if self.children.exporter is not None:
            self.children.exporter.set_targets(targets)
        else:
            self.children.exporter = start_exporter(
                targets, port=self.exporter_port, timeout_s=observe.exporter_timeout_s,
                host=observe.exporter_host,
            )
        prometheus = self.children.prometheus
        if prometheus is not None:
            prometheus.wait_scraping()
            for target in targets:  # the load starts once Prometheus holds every server's series
                prometheus.wait_for_series(f'quantload_target_up{{server="{target.name}"}}')

    def _load_one(self, item: _Served) -> None:
        from quantload.load.api import Target, run_open_loop, run_prefix_cache_experiment, run_sweep

        server = item.server
        target = Target(
            name=f"llama-{item.quant.lower()}",
            quant=item.quant,
            model=server.spec.alias.rsplit("-", 1)[0],
            url=server.url,
            api_key=server.spec.api_key,
        )
        load = self._load_settings()
        observe = self.settings.observe  # stage annotations go to observe.grafana_url when one is set
        experiments: list[tuple[str, str, Callable[[ProgressCallback], list[Any]]]] = [
            ("load", f"load sweep {item.quant}",
             lambda p: run_sweep(target, load, self.run_dir, self.run_id, p, observe=observe)),
        ]
        if load.prefix_requests > 0 and load.prefix_tokens > 0:
            experiments.append(
                ("prefix_cache", f"prompt cache {item.quant}",
                 lambda p: run_prefix_cache_experiment(
                     target, load, self.run_dir, self.run_id, p, observe=observe
                 ))
            )
        if load.rates_rps:
            experiments.append(
                ("open_loop", f"open loop {item.quant}",
                 lambda p: run_open_loop(target, load, self.run_dir, self.run_id, p, observe=observe))
            )
        for name, title, run in experiments:
            if item.quant in self.dead_quants:
                self.state.fail_unrun(name, item.quant, "llama-server died earlier in the run")
                continue
            with self._step(name, item.quant, title) as step:
                summaries = run(step.progress)
                step.busy_seconds = _stage_busy_seconds(
                    self.run_dir / STAGES_JSONL, [s.stage_id for s in summaries]
                )
                failed = [s for s in summaries if s.status != "ok"]
                if failed:
                    step.status = "failed"
                    first = failed[0]
                    step.error = f"{len(failed)} of {len(summaries)} stages {first.status}: {first.reason}"
            if not server.alive():
                self.dead_quants.add(item.quant)
                self.state.server(item.quant, status="died", exit_code=server.stop())
                self.view.message(f"llama-server {item.quant} died; its remaining stages are marked failed")
        if item.quant not in self.dead_quants:
            self.state.server(item.quant, status="ok")

    def _mark_rest_failed(self, quant: str, why: str) -> None:
        for name in ("kv", "load", "prefix_cache"):
            self.state.fail_unrun(name, quant, why)

    def _report(self) -> None:
        from quantload.analysis import build_report

        prometheus = self.children.prometheus
        url = prometheus.url if prometheus is not None else None
        with self._step("report", title="report") as step:
            paths = build_report(self.run_dir, url, self.settings.report)
            step.progress(1, 1, str(paths.html))
            self.report_paths = paths


@dataclass
class _StepContext:
    """What a step body can set: its outcome beyond success, and its measuring time."""

    progress: ProgressCallback
    status: Any = "ok"
    error: str | None = None
    busy_seconds: float | None = None
    fatal: bool = False


def _folder_name(source: str) -> str:
    path = Path(source)
    if path.suffix == ".gguf":
        return f"local-{path.stem}"
    return source.replace("/", "-")


def _absolute(manifest: Manifest, folder: Path) -> Manifest:
    """The manifest with every entry's path pointing at the prepared file."""
    files = {
        quant: entry.model_copy(update={"path": str((folder / entry.file).resolve())})
        for quant, entry in manifest.files.items()
    }
    return manifest.model_copy(update={"files": files})


def _copy_logs(source_dir: Path, target_dir: Path, prefix: str) -> None:
    """Copy the tool logs of the shared prepared folder into the run (files made earlier included)."""
    if not source_dir.is_dir():
        return
    for log in sorted(source_dir.glob("*.log")):
        shutil.copyfile(log, target_dir / f"{prefix}{log.name}")
