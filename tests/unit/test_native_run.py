"""NativeRun over fake steps: the order of the steps, what run.json says, failures and interruptions.

No llama.cpp, no Locust, no Prometheus: every step is a fake that records its call, so these tests
run in well under a second and pin the sequence itself.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from quantload.analysis import ReportPaths
from quantload.config import load_config
from quantload.errors import ConfigError, MeasurementError, ModelError, ServerError
from quantload.experiments import registry
from quantload.experiments.base import ExperimentRun, ServedVariant, ServerFlags
from quantload.llamacpp.offload import OffloadCheck, check_offload, parse_offload
from quantload.rundir.gpu_file import IdleWindow
from quantload.stack.native import NativeRun
from quantload.stack.run_steps import RunSteps

QUANTS = ("F16", "Q8_0", "Q4_K_M")
CI_EXPERIMENTS = ("sweep", "prefix_cache", "sessions", "mixed", "limit_users", "kv_types")  # the ci profile's
CI_STEPS = ("load", "prefix_cache", "sessions", "mixed", "limit_users", "kv_types")  # their steps in run.json


class Silent:
    """A RunView that shows nothing."""

    def step(self, title: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None

    def message(self, text: str) -> None:
        pass


class FakeSpec:
    api_key = None
    cache_type_k = cache_type_v = "f16"

    def __init__(self, alias: str) -> None:
        self.alias = alias


class FakeServer:
    """Quacks like LlamaServer; `dies_after` experiments it stops being alive."""

    def __init__(self, calls: list[str], quant: str, log_path: Path, fails: bool, dies_after: int | None) -> None:
        self.calls, self.quant, self.log_path = calls, quant, log_path
        self.fails, self.dies_after = fails, dies_after
        self.spec = FakeSpec(f"tiny-{quant}")
        self.url = f"http://127.0.0.1:1{len(quant)}"
        self.pid = 4242
        self.running = False
        self.experiments = 0

    def start(self) -> FakeServer:
        self.calls.append(f"start {self.quant}")
        if self.fails:
            raise ServerError(f"llama-server for {self.quant} did not become ready: boom")
        self.running = True
        return self

    def alive(self) -> bool:
        return self.running and (self.dies_after is None or self.experiments < self.dies_after)

    def stop(self) -> int | None:
        if self.running:
            self.calls.append(f"stop {self.quant}")
        self.running = False
        return 0


class FakeVariants:
    """The server control of one fake server: each variant is a call, in place or beside it."""

    def __init__(self, calls: list[str], target: Any, in_place: bool) -> None:
        self.calls, self.target, self.in_place = calls, target, in_place

    @contextlib.contextmanager
    def variant(self, flags: ServerFlags) -> Iterator[ServedVariant]:
        how = "in place" if self.in_place else "beside"
        self.calls.append(f"variant {self.target.quant} {flags.label} {how}")
        name = self.target.name if self.in_place else f"{self.target.name}-{flags.label}"
        yield ServedVariant(self.target.model_copy(update={"name": name}), flags)
        self.calls.append(f"variant over {self.target.quant}")


class FakeExporter:
    def __init__(self, calls: list[str]) -> None:
        self.calls = calls
        self.targets: list[Any] = []

    def set_targets(self, targets: list[Any]) -> None:
        self.targets = list(targets)

    def stop(self) -> None:
        self.calls.append("stop exporter")


class FakePrepared:
    model_name = "tiny"
    busy_s = 2.0
    reference = "F16"

    def quants(self) -> list[str]:
        return ["F16", "Q8_0", "Q4_K_M"]  # the manifest's order, largest first

    def path(self, quant: str) -> Path:
        return Path(f"/models/tiny-{quant}.gguf")


class FakeSteps(RunSteps):
    """Every step recorded in `calls`; `fail` maps a call to the exception it raises."""

    def __init__(self, fail: dict[str, BaseException] | None = None, dies: dict[str, int] | None = None,
                 no_start: tuple[str, ...] = (), gpu_logs: dict[str, str] | None = None) -> None:
        self.calls: list[str] = []
        self.gpu_logs = gpu_logs or {}  # quant -> what its server's launch logged of its layers
        self.fail = fail or {}
        self.dies = dies or {}
        self.no_start = no_start
        self.servers: dict[str, FakeServer] = {}
        self.exporter_handle: FakeExporter | None = None
        self.contexts: list[Any] = []

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if name in self.fail:
            raise self.fail[name]

    def toolchain(self, progress: Any) -> Any:
        self._call("toolchain")
        return object()

    def prepare(self, toolchain: Any, run_dir: Path, progress: Any) -> Any:
        self._call("prepare")
        return FakePrepared()

    def quality_text(self) -> Path:
        self._call("quality_text")
        return Path("/data/wiki.test.raw")

    def quality(self, toolchain: Any, model: Path, quant: str, text: Path, run_dir: Path, progress: Any) -> Any:
        self._call(f"quality {quant}")
        return object()

    def kld(self, toolchain: Any, models: Any, quants: Any, text: Path, run_dir: Path, attempt: Any) -> Any:
        self._call("kld")
        return None

    def sensitivity(self, toolchain: Any, reference: Path, text: Path, run_dir: Path, progress: Any) -> Any:
        self._call(f"sensitivity {reference.name}")
        return object()

    def probe(self) -> Any:
        self._call("probe")
        return object()

    def speed(self, toolchain: Any, model: Path, quant: str, limits: Any, run_dir: Path, progress: Any) -> Any:
        self._call(f"speed {quant}")
        return object()

    def predict_workload(self, cwd: Path) -> Any:
        self._call("predict_workload")
        return object()

    def predict(self, toolchain: Any, model: Path, quant: str, shapes: Any, run_dir: Path, progress: Any) -> Any:
        self._call(f"predict {quant}")
        return object()

    def prometheus_missing(self) -> str | None:
        return "the 'prometheus' binary is not installed"

    def server(self, toolchain: Any, model: Path, alias: str, quant: str, run_dir: Path) -> Any:
        self.calls.append(f"server {quant}")
        server = FakeServer(self.calls, quant, run_dir / "logs" / f"llama-server-{quant}.log",
                            quant in self.no_start, self.dies.get(quant))
        self.servers[quant] = server
        return server

    def check_kv(self, toolchain: Any, server: Any, quant: str, run_dir: Path) -> Any:
        self._call(f"kv {quant}")
        return object()

    def check_offload(self, server: Any, quant: str, run_dir: Path) -> OffloadCheck:
        return check_offload("all", parse_offload(self.gpu_logs.get(quant, "")))

    def idle_baseline(self, quants: Any, run_dir: Path) -> IdleWindow:
        self._call(f"idle {' '.join(quants)}")
        return IdleWindow(quants=tuple(quants), start_unix_s=1.0, end_unix_s=2.0)

    def server_variants(self, toolchain: Any, served: Any, run_dir: Path, in_place: bool) -> Any:
        return FakeVariants(self.calls, served.load_target(), in_place)

    def exporter(self, port: int) -> Any:
        self.calls.append("exporter")
        self.exporter_handle = FakeExporter(self.calls)
        return self.exporter_handle

    def experiment(self, experiment: str, target: Any, context: Any, servers: Any) -> ExperimentRun:
        self._call(f"{experiment} {target.quant}")
        self.contexts.append(context)
        self.servers[target.quant].experiments += 1
        if registry.get(experiment).server_flags != "none":  # what the experiment does with them
            with servers.variant(ServerFlags(label=experiment)) as variant:
                self.calls.append(f"load on {variant.target.name}")
        return ExperimentRun(experiment, (), busy_s=1.5)

    def report(self, run_dir: Path, prometheus_url: str | None) -> ReportPaths:
        self._call("report")
        md = run_dir / "report.md"
        return ReportPaths(md, run_dir / "report.html", run_dir / "table.csv", run_dir / "summary.json", (), 0)


def _run(tmp_path: Path, steps: FakeSteps) -> NativeRun:
    config = load_config(tmp_path, {}, {"model.source": "tiny", "run.profile": "ci"})
    return NativeRun(config, {}, tmp_path / "results", Silent(), steps)


def _run_json(run: NativeRun) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((run.run_dir / "run.json").read_text())
    return data


def _steps(data: dict[str, Any]) -> list[tuple[str, str | None, str]]:
    return [(s["name"], s["quant"], s["status"]) for s in data["steps"]]


def test_the_steps_run_in_order_and_run_json_says_finished(tmp_path: Path) -> None:
    steps = FakeSteps()
    run = _run(tmp_path, steps)
    outcome = run.execute()
    per_quant = []
    for quant in QUANTS:
        served = f"llama-{quant.lower()}"
        experiments = []
        for experiment in CI_EXPERIMENTS:
            experiments.append(f"{experiment} {quant}")
            if experiment in ("mixed", "kv_types"):  # they vary the server's flags: in place, alone
                experiments += [f"variant {quant} {experiment} in place", f"load on {served}",
                                f"variant over {quant}"]  # fmt: skip
        per_quant += [f"server {quant}", f"start {quant}", f"kv {quant}", *experiments, f"stop {quant}"]
    assert steps.calls == [
        "toolchain", "prepare", "quality_text", *(f"quality {q}" for q in QUANTS), "kld", "probe",
        *(f"speed {q}" for q in QUANTS), "predict_workload", *(f"predict {q}" for q in QUANTS), "exporter",
        *per_quant, "stop exporter", "report",
    ]
    data = _run_json(run)
    assert data["status"] == "finished" and data["finished_unix_s"] is not None
    assert all(status == "ok" for _, _, status in _steps(data))
    assert {quant: server["status"] for quant, server in data["servers"].items()} == dict.fromkeys(QUANTS, "ok")
    assert data["prometheus"]["available"] is False and "not installed" in data["prometheus"]["why"]
    assert outcome.run_dir == run.run_dir and outcome.report is not None
    load_steps = [s for s in data["steps"] if s["name"] in CI_STEPS]
    assert len(load_steps) == 18 and all(s["busy_seconds"] == 1.5 for s in load_steps)
    # one run context for every experiment: the run's folder, id and the load processes' port
    assert {(c.run_dir.path, c.run_id, c.loadgen_port) for c in steps.contexts} == {
        (run.run_dir, run.run_id, run.ports.loadgen)
    }


def test_a_failed_measurement_is_recorded_and_the_run_goes_on(tmp_path: Path) -> None:
    steps = FakeSteps(fail={"quality Q8_0": MeasurementError("llama-perplexity was killed", "see the log")})
    run = _run(tmp_path, steps)
    run.execute()
    data = _run_json(run)
    failed = [s for s in data["steps"] if s["status"] == "failed"]
    assert [(s["name"], s["quant"]) for s in failed] == [("quality", "Q8_0")]
    assert failed[0]["error"] == "llama-perplexity was killed (see the log)"
    assert "quality Q4_K_M" in steps.calls and "report" in steps.calls
    assert data["status"] == "finished"


def test_a_failed_preparation_ends_the_run_with_its_error(tmp_path: Path) -> None:
    steps = FakeSteps(fail={"prepare": ModelError("model.gguf is not a GGUF file", "pass a .gguf file")})
    run = _run(tmp_path, steps)
    with pytest.raises(ModelError):
        run.execute()
    data = _run_json(run)
    assert data["status"] == "failed"
    assert _steps(data) == [("toolchain", None, "ok"), ("prepare", None, "failed")]
    assert steps.calls == ["toolchain", "prepare"]


def test_a_server_that_does_not_start_fails_its_quantization_only(tmp_path: Path) -> None:
    steps = FakeSteps(no_start=("Q8_0",))
    run = _run(tmp_path, steps)
    run.execute()
    data = _run_json(run)
    q8 = [(name, status) for name, quant, status in _steps(data) if quant == "Q8_0"
          and name not in ("quality", "speed", "predict")]
    assert q8 == [("serve", "failed"), ("kv", "failed"), *((name, "failed") for name in CI_STEPS)]
    assert data["servers"]["Q8_0"]["status"] == "failed_to_start"
    assert data["servers"]["Q4_K_M"]["status"] == "ok"
    assert "sweep Q8_0" not in steps.calls and "sweep Q4_K_M" in steps.calls


def test_a_server_that_dies_fails_its_remaining_experiments(tmp_path: Path) -> None:
    steps = FakeSteps(dies={"F16": 1})
    run = _run(tmp_path, steps)
    run.execute()
    data = _run_json(run)
    f16 = {name: (status, error) for name, quant, status, error in
           ((s["name"], s["quant"], s["status"], s["error"]) for s in data["steps"]) if quant == "F16"}
    assert f16["load"] == ("ok", None)
    assert f16["prefix_cache"] == ("failed", "llama-server died earlier in the run")
    assert data["servers"]["F16"]["status"] == "died"
    assert "prefix_cache F16" not in steps.calls and "prefix_cache Q8_0" in steps.calls


def test_an_interruption_stops_every_child_and_marks_the_run_interrupted(tmp_path: Path) -> None:
    steps = FakeSteps(fail={"prefix_cache Q8_0": KeyboardInterrupt()})
    run = _run(tmp_path, steps)
    with pytest.raises(KeyboardInterrupt):
        run.execute()
    data = _run_json(run)
    assert data["status"] == "interrupted"
    last = data["steps"][-1]
    assert (last["name"], last["quant"], last["status"]) == ("prefix_cache", "Q8_0", "failed")
    assert "KeyboardInterrupt" in last["error"]
    assert steps.calls[-2:] == ["stop Q8_0", "stop exporter"]
    assert not any(server.running for server in steps.servers.values())
    assert "report" not in steps.calls


def test_servers_at_once_start_together_and_stop_at_the_end(tmp_path: Path) -> None:
    steps = FakeSteps()
    config = load_config(tmp_path, {}, {"model.source": "tiny", "run.profile": "ci", "run.servers_at_once": True})
    NativeRun(config, {}, tmp_path / "results", Silent(), steps).execute()
    starts = [i for i, call in enumerate(steps.calls) if call.startswith("start ")]
    sweeps = [i for i, call in enumerate(steps.calls) if call.startswith("sweep ")]
    assert max(starts) < min(sweeps)
    assert steps.calls[-5:] == ["stop Q4_K_M", "stop Q8_0", "stop F16", "stop exporter", "report"]
    assert steps.exporter_handle is not None and len(steps.exporter_handle.targets) == 3
    # servers sharing the machine are never restarted under the others: a variant runs beside them
    variants = [call for call in steps.calls if call.startswith("variant ") and "over" not in call]
    assert variants and all(call.endswith("beside") for call in variants)
    assert "load on llama-q8_0-kv_types" in steps.calls


def test_the_loadgen_ports_cover_every_worker(tmp_path: Path) -> None:
    config = load_config(tmp_path, {}, {"model.source": "tiny", "load.workers": 2})
    run = NativeRun(config, {}, tmp_path / "results", Silent(), FakeSteps())
    port = run.ports.loadgen
    assert run.ports.loadgen_urls(config.settings, tmp_path) == [
        f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}", f"http://127.0.0.1:{port + 2}",
    ]


class FlagSteps(FakeSteps):
    """FakeSteps with a llama-server build, a tune and adopting its winner recorded."""

    def __init__(self, build: Any = None, winner: Any = "winner") -> None:
        super().__init__()
        self.build, self.winner = build, winner

    def server_build(self, toolchain: Any) -> Any:
        from quantload.llamacpp.server_help import ServerBuild

        self.calls.append("server_build")
        return self.build or ServerBuild(frozenset({"--parallel"}), ("f16", "q8_0"), ("none", "draft-simple", "ngram-mod"))

    def tune(self, served: Any, servers: Any, context: Any, toolchain: Any) -> Any:
        self.calls.append(f"tune {served.quant}")
        winner = None if self.winner is None else type("Config", (), {"key": f"{self.winner} {served.quant}"})()
        return type("Outcome", (), {"winner": winner, "busy_s": 3.0})()

    def adopt(self, servers: Any, config: Any, quant: str, run_dir: Path) -> Any:
        self.calls.append(f"adopt {config.key}")
        return None


def test_a_bad_input_of_a_planned_experiment_ends_the_run_before_any_server(tmp_path: Path) -> None:
    from quantload.errors import ConfigError

    steps = FlagSteps()
    flags = {"model.source": "tiny", "run.profile": "ci", "load.experiments": ["sweep", "speculation"],
             "speculation.draft_model": str(tmp_path / "draft.gguf")}  # fmt: skip
    run = NativeRun(load_config(tmp_path, {}, flags), {}, tmp_path / "results", Silent(), steps)
    with pytest.raises(ConfigError, match=r"draft\.gguf does not exist"):
        run.execute()
    assert steps.calls == ["toolchain", "prepare", "server_build"]
    assert _steps(_run_json(run))[-1] == ("preflight", None, "failed")


class DeviceSteps(FlagSteps):
    """FlagSteps whose llama-server lists the given devices (or cannot reach its RPC hosts)."""

    def __init__(self, devices: Any) -> None:
        super().__init__()
        self.found = devices

    def devices(self, toolchain: Any) -> Any:
        self.calls.append("devices")
        if isinstance(self.found, BaseException):
            raise self.found
        return self.found


def test_expert_placement_on_a_cpu_only_machine_ends_the_run_before_any_server(tmp_path: Path) -> None:
    from quantload.errors import ConfigError

    steps = DeviceSteps(devices=())
    flags = {"model.source": "tiny", "run.profile": "ci", "load.experiments": ["sweep"],
             "server.expert_placement": "n-cpu-moe:2"}  # fmt: skip
    run = NativeRun(load_config(tmp_path, {}, flags), {}, tmp_path / "results", Silent(), steps)
    with pytest.raises(ConfigError, match=r"server\.expert_placement = 'n-cpu-moe:2' keeps experts in host memory"):
        run.execute()
    assert steps.calls == ["toolchain", "prepare", "devices"]
    assert _steps(_run_json(run))[-1] == ("preflight", None, "failed")


def test_rpc_hosts_that_do_not_answer_end_the_run_before_any_server(tmp_path: Path) -> None:
    from quantload.errors import ServerError

    steps = DeviceSteps(devices=ServerError("llama-server could not reach its RPC hosts 10.0.0.9:50052: refused"))
    flags = {"model.source": "tiny", "run.profile": "ci", "load.experiments": ["sweep"],
             "server.rpc": ["10.0.0.9:50052"]}  # fmt: skip
    run = NativeRun(load_config(tmp_path, {}, flags), {}, tmp_path / "results", Silent(), steps)
    with pytest.raises(ServerError, match="could not reach its RPC hosts"):
        run.execute()
    assert steps.calls == ["toolchain", "prepare", "devices"]
    assert _steps(_run_json(run))[-1] == ("preflight", None, "failed")


def test_a_run_without_checked_experiments_has_no_preflight_step(tmp_path: Path) -> None:
    steps = FlagSteps()
    run = _run(tmp_path, steps)
    run.execute()
    assert "server_build" not in steps.calls and "preflight" not in [name for name, _, _ in _steps(_run_json(run))]


def test_run_tune_tunes_each_server_then_serves_the_rest_of_the_run_with_the_winner(tmp_path: Path) -> None:
    steps = FlagSteps()
    flags = {"model.source": "tiny", "run.profile": "ci", "run.tune": True, "model.quants": ["Q8_0"],
             "load.experiments": ["sweep"]}  # fmt: skip
    run = NativeRun(load_config(tmp_path, {}, flags), {}, tmp_path / "results", Silent(), steps)
    run.execute()
    assert steps.calls[steps.calls.index("kv Q8_0") + 1 :][:3] == ["tune Q8_0", "adopt winner Q8_0", "sweep Q8_0"]
    data = _run_json(run)
    assert ("tune", "Q8_0", "ok") in _steps(data) and "server_build" in steps.calls  # the tune's space checked
    assert any("served with the tuned flags winner Q8_0" in note for note in data["notes"])


def test_a_tune_without_a_winner_leaves_the_configured_flags_and_says_so(tmp_path: Path) -> None:
    steps = FlagSteps(winner=None)
    flags = {"model.source": "tiny", "run.profile": "ci", "run.tune": True, "model.quants": ["Q8_0"],
             "load.experiments": ["sweep"]}  # fmt: skip
    run = NativeRun(load_config(tmp_path, {}, flags), {}, tmp_path / "results", Silent(), steps)
    run.execute()
    assert not any(call.startswith("adopt") for call in steps.calls) and "sweep Q8_0" in steps.calls
    assert any("(no configuration was shown to beat the configured flags); served with the configured flags" in n for n in _run_json(run)["notes"])
def test_the_full_profile_scans_the_tensors_from_the_reference_after_the_kld(tmp_path: Path) -> None:
    steps = FakeSteps()
    config = load_config(tmp_path, {}, {"model.source": "tiny", "load.experiments": ("sweep",)})
    outcome = NativeRun(config, {}, tmp_path / "results", Silent(), steps).execute()
    assert steps.calls.index("kld") < steps.calls.index("sensitivity tiny-F16.gguf") < steps.calls.index("probe")
    run = json.loads((outcome.run_dir / "run.json").read_text())
    assert [s["status"] for s in run["steps"] if s["name"] == "sensitivity"] == ["ok"]
    quick = FakeSteps()  # the quick and ci profiles leave it out
    NativeRun(load_config(tmp_path, {}, {"model.source": "tiny", "run.profile": "ci"}), {}, tmp_path / "q",
              Silent(), quick).execute()  # fmt: skip
    assert not any(call.startswith("sensitivity") for call in quick.calls)


def test_the_gpus_are_watched_idle_before_the_load_of_a_server_that_offloaded_layers(tmp_path: Path) -> None:
    device = "llama_model_load_from_file_impl: using device CUDA0 (NVIDIA H100) (0000:3b:00.0) - 80000 MiB free\n"
    on_gpu = device + "load_tensors: offloaded 25/25 layers to GPU\n"
    steps = FakeSteps(gpu_logs={"Q8_0": on_gpu, "F16": device + "load_tensors: offloaded 3/25 layers to GPU\n"})
    run = _run(tmp_path, steps)
    run.execute()
    # one server at a time: its own baseline just before its load; none for the CPU server (Q4_K_M)
    for quant in ("F16", "Q8_0"):
        assert steps.calls.index(f"idle {quant}") == steps.calls.index(f"kv {quant}") + 1
    assert "idle Q4_K_M" not in steps.calls
    data = _run_json(run)
    offload = {quant: status for name, quant, status in _steps(data) if name == "offload"}
    assert offload == dict.fromkeys(QUANTS, "ok")
    assert any("F16: 3/25 layers offloaded" in note and "fewer than" in note for note in data["notes"])
    off = load_config(tmp_path, {}, {"model.source": "tiny", "run.profile": "ci", "observe.idle_baseline": "off"})
    quiet = FakeSteps(gpu_logs={"Q8_0": on_gpu})
    NativeRun(off, {}, tmp_path / "off", Silent(), quiet).execute()
    assert not [call for call in quiet.calls if call.startswith("idle")]


def test_an_offline_run_says_how_to_give_the_text_at_its_start_and_again_in_its_last_lines(tmp_path: Path) -> None:
    from quantload.quality.dataset import _offline_hint

    hint = _offline_hint(tmp_path, "https://example.invalid/wikitext-2-raw-v1.zip")
    assert "--dataset PATH" in hint and "`make run DATASET=PATH`" in hint  # the flag and the make variable
    steps = FakeSteps(fail={"quality_text": ConfigError("WikiText-2 cannot be downloaded: offline", hint)})
    outcome = _run(tmp_path, steps).execute()
    (again,) = outcome.again
    assert again.startswith("quality skipped: WikiText-2 cannot be downloaded: offline") and "DATASET=PATH" in again
    assert outcome.report is not None  # the run went on without quality


def test_each_file_is_predicted_after_its_speed_and_before_any_server(tmp_path: Path) -> None:
    steps = FakeSteps()
    run = _run(tmp_path, steps)
    run.execute()
    assert steps.calls.index("speed Q4_K_M") < steps.calls.index("predict F16") < steps.calls.index("exporter")
    predicted = [(quant, status) for name, quant, status in _steps(_run_json(run)) if name == "predict"]
    assert predicted == [(quant, "ok") for quant in QUANTS]


def test_a_failed_prediction_is_recorded_with_its_reason_and_the_run_goes_on(tmp_path: Path) -> None:
    missing = ConfigError("the llama.cpp tools in /bin have no llama-batched-bench", "build it")
    steps = FakeSteps(fail={"predict Q8_0": missing})
    run = _run(tmp_path, steps)
    run.execute()
    data = _run_json(run)
    failed = [(s["name"], s["quant"], s["error"]) for s in data["steps"] if s["status"] == "failed"]
    assert failed == [("predict", "Q8_0", missing.one_line())]
    assert "predict Q4_K_M" in steps.calls and "start Q8_0" in steps.calls and data["status"] == "finished"


def test_a_workload_the_model_does_not_predict_skips_the_step_with_why(tmp_path: Path) -> None:
    steps = FakeSteps(fail={"predict_workload": ConfigError("workload.kind = trace is not predicted yet")})
    run = _run(tmp_path, steps)
    run.execute()
    (skipped,) = [s for s in _run_json(run)["steps"] if s["name"] == "predict"]
    assert skipped["status"] == "skipped" and skipped["quant"] is None
    assert skipped["error"] == "workload.kind = trace is not predicted yet"
    assert not any(call.startswith("predict ") for call in steps.calls) and "report" in steps.calls


def test_predict_enabled_false_turns_the_step_off_and_says_so(tmp_path: Path) -> None:
    steps = FakeSteps()
    config = load_config(tmp_path, {}, {"model.source": "tiny", "run.profile": "ci", "predict.enabled": False})
    run = NativeRun(config, {}, tmp_path / "results", Silent(), steps)
    run.execute()
    assert not any(call.startswith("predict") for call in steps.calls)
    (skipped,) = [s for s in _run_json(run)["steps"] if s["name"] == "predict"]
    assert (skipped["status"], skipped["error"]) == ("skipped", "turned off (predict.enabled = false)")
