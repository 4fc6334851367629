"""The run driver `quantload run`, `quantload tune` and `quantload load` all build their run with:
the run's folder, its `RunContext` and its state (`RunState`), quantload's llama-servers started
and stopped with their KV-cache and offload checks, and experiments run against a served target,
each one a recorded step. The commands keep only their own sequence (NativeRun, tune_run,
cmd_load); none makes a folder, a context or a server, or decides what a failure does, itself.

The failure rule, one for every command:

- Every step is recorded in the run's state as it begins and ends: run.json for `quantload run`;
  in memory for `quantload load` (its --out may hold another run's run.json) and `quantload tune`
  (whose folder keeps the files it always had).
- A QuantloadError in a step is recorded as that step's failure and the driver goes on with the
  next step: a failure is a fact about one server or one measurement, and the others' measurements
  stay worth having (a run of an hour is not thrown away for one quantization).
- Except where going on cannot help, when the error is recorded and raised (the CLI edge makes it
  one line and exit code 2): a step the run cannot do without (`required`: the toolchain, the model
  files, the preflight), and a ConfigError or WriteError in an experiment (the settings or an
  input file are wrong, or the disk refuses the run's files: every later experiment would meet it
  again, and the user needs its line and hint).
- A server that is gone fails its remaining experiments without running them: one quantload
  started whose process died, or one it was given as a URL that stopped answering (ServerError).
  Load workers that did not join fail every remaining experiment: no later plan would fare better.
- Anything else (a bug, a disk that refuses a write, an interruption) is recorded and raised.

`failures` lists the failed steps: `quantload load` and `quantload tune` exit 1 when there is any.
`quantload run` exits 0 once it has finished; its run.json and report say what failed.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, TypeVar

from quantload.config import ResolvedConfig, Settings
from quantload.errors import ConfigError, QuantloadError, ServerError, WriteError
from quantload.experiments.base import Experiment, ExperimentRun, ServerControl
from quantload.llamacpp.server import LlamaServer
from quantload.llamacpp.toolchain import Toolchain
from quantload.load.processes import workers_absent
from quantload.models.prepared import PreparedModels
from quantload.progress import ProgressCallback
from quantload.run_context import RunContext, Warn
from quantload.rundir import make_run_id
from quantload.rundir.config_file import write_run_config
from quantload.rundir.handle import RunDir
from quantload.rundir.run_file import RunStatus
from quantload.served import ServedTarget, server_alias, server_name
from quantload.stack.run_state import RunState
from quantload.stack.run_steps import RunSteps, Served

T = TypeVar("T")

DIED = "llama-server died earlier in the run"
UNREACHABLE = "the server stopped answering earlier in the run"
NO_WORKERS = "the load workers did not join earlier in the run"


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
    """A step that ended failed (`ran`) or was not run (`ran` False); `why` is what the run's
    state records; `unreachable`: it failed because its server stopped answering."""

    why: str
    unreachable: bool = False
    ran: bool = True


@dataclass(frozen=True)
class ExperimentOutcome:
    """One experiment that was attempted against `target`: its stages when it ran to its end
    (`run`), and why it counts as failed (`failure`, None when it did not)."""

    target: ServedTarget
    experiment: str
    run: ExperimentRun | None
    failure: str | None
    unreachable: bool = False


@dataclass(frozen=True)
class RunPlace:
    """Where a run lives and how it speaks: its folder and id, the command's working folder and
    environment, the port its load processes serve /metrics on (None: load.metrics_port), and
    where its warnings go (None: the view's messages)."""

    folder: Path
    run_id: str
    cwd: Path
    environ: Mapping[str, str]
    loadgen_port: int | None = None
    warn: Warn | None = None


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


def new_run_dir(out: Path, config: ResolvedConfig) -> Path:
    """A fresh folder `out/<run-id>` holding the run's config.json and its logs folder; never an
    existing one, so a finished run is never overwritten."""
    run_id = make_run_id(config.settings.model_dump(mode="json"))
    run_dir = out / run_id
    suffix = 1
    while run_dir.exists():
        suffix += 1
        run_dir = out / f"{run_id}-{suffix}"
    run_dir.mkdir(parents=True)
    RunDir(run_dir).logs_path.mkdir()
    write_run_config(run_dir, config)
    return run_dir


class RunDriver:
    """One run's folder, context, state, servers and experiments (see the module docstring)."""

    def __init__(
        self, place: RunPlace, settings: Settings, view: RunView, steps: RunSteps, record: bool
    ) -> None:
        """`record`: keep the state in the folder's run.json (else in memory only)."""
        self.settings = settings
        self.view = view
        self.steps = steps
        self.run_dir = place.folder
        self.run_id = place.run_id
        run = settings.run
        self.state = RunState(
            place.folder, place.run_id, run.profile, settings.model.source, run.servers_at_once,
            written=record,
        )  # fmt: skip
        self.context = RunContext(
            RunDir(place.folder), place.run_id, settings, warn=place.warn or view.message,
            loadgen_port=place.loadgen_port, cwd=place.cwd, environ=place.environ,
        )  # fmt: skip
        self.on_gpu: dict[str, bool] = {}  # quant -> its server offloaded layers (offload check)
        self._gone: dict[str, str] = {}  # target name -> why its remaining experiments do not run
        self.workers_missing: str | None = None  # why the load workers did not join, once seen

    # ------------------------------------------------------------------ steps

    def attempt(
        self,
        name: str,
        quant: str | None,
        title: str,
        body: Callable[[ProgressCallback], T],
        account: Account[T] = overhead,
        raises: tuple[type[QuantloadError], ...] = (),
    ) -> T | Failed:
        """Run one step body, recorded in the run's state: a QuantloadError becomes Failed (one of
        `raises` is raised instead); anything else is recorded and raised."""
        index = self.state.begin(name, quant)
        progress = self.view.step(title)
        started = time.monotonic()
        try:
            result = body(progress)
        except QuantloadError as error:
            self.state.end(index, "failed", error.one_line())
            self.view.message(f"{title} failed: {error.one_line()}")
            if isinstance(error, raises):
                raise
            return Failed(error.one_line(), unreachable=isinstance(error, ServerError))
        except BaseException as error:
            self.state.end(index, "failed", f"{type(error).__name__}: {error}")
            raise
        busy_s, problem = account(result, time.monotonic() - started)
        self.state.end(index, "failed" if problem else "ok", problem, busy_s)
        return result

    def required(
        self, name: str, title: str, body: Callable[[ProgressCallback], T], account: Account[T] = measuring
    ) -> T:
        """A step the run cannot go on without: its failure is recorded and raised."""
        result = self.attempt(name, None, title, body, account, raises=(QuantloadError,))
        assert not isinstance(result, Failed)  # a failure raised instead
        return result

    def failures(self) -> list[str]:
        """Every failed step so far, one line each."""
        return [
            " ".join(part for part in (step.name, step.quant) if part) + f": {step.error}"
            for step in self.state.steps()
            if step.status == "failed"
        ]

    def finish(self, status: RunStatus) -> None:
        """Close the run's state, unless it is closed already."""
        if self.state.status == "running":
            self.state.finish(status)

    # ------------------------------------------------------------------ servers

    def serve(
        self,
        toolchain: Toolchain,
        models: PreparedModels,
        quant: str,
        stack: contextlib.ExitStack,
        then: Sequence[str] = (),
    ) -> Served | Failed:
        """Start one quantization's server (stopped when `stack` closes), check its KV cache and
        its layers' placement; when it does not start, its KV check and the steps `then` are
        recorded failed."""
        server = self.steps.server(
            toolchain, models.path(quant), server_alias(models.model_name, quant), quant, self.run_dir
        )  # fmt: skip
        stack.callback(server.stop)
        log = str(server.log_path)
        started = self.attempt("serve", quant, f"start llama-server {quant}", lambda _: server.start())
        if isinstance(started, Failed):
            self.state.server(quant, log=log, status="failed_to_start")
            for name in ("kv", *then):
                self.state.fail_unrun(name, quant, "llama-server did not start")
            return started
        self.state.server(quant, url=server.url, log=log, pid=server.pid, status="running")
        self.attempt(
            "kv", quant, f"KV check {quant}",
            lambda _: self.steps.check_kv(toolchain, server, quant, self.run_dir),
        )  # fmt: skip
        self._check_offload(server, quant)
        return Served(quant, server, name=server_name(quant), model=models.model_name)

    def _check_offload(self, server: LlamaServer, quant: str) -> None:
        """The layers on the GPU against server.gpu_layers (gpu.json); fewer than asked is said."""
        check = self.attempt(
            "offload", quant, f"GPU offload check {quant}",
            lambda _: self.steps.check_offload(server, quant, self.run_dir),
        )  # fmt: skip
        if isinstance(check, Failed):
            return
        self.on_gpu[quant] = check.on_gpu
        if check.verdict == "fewer than asked":
            self.view.message(f"llama-server {quant}: {check.line}")
            self.state.note(f"{quant}: {check.line}")

    def check_alive(self, target: ServedTarget, server: LlamaServer) -> None:
        """A server quantload started that died: recorded, and its remaining experiments fail."""
        if target.name in self._gone or server.alive():
            return
        self._gone[target.name] = DIED
        self.state.server(target.quant, status="died", exit_code=server.stop())
        self.view.message(f"llama-server {target.quant} died; its remaining stages are marked failed")

    def is_gone(self, target: ServedTarget) -> bool:
        """Whether `target`'s remaining experiments fail without running."""
        return target.name in self._gone

    # ------------------------------------------------------------------ experiments

    def attempt_against(
        self,
        target: ServedTarget,
        step: str,
        title: str,
        body: Callable[[ProgressCallback], T],
        account: Account[T],
        server: LlamaServer | None = None,
    ) -> T | Failed:
        """One experiment against `target` under the failure rule; `server` is its llama-server
        where quantload started it (None for a URL quantload was given)."""
        why_not = self._gone.get(target.name) or (NO_WORKERS if self.workers_missing else None)
        if why_not is not None:
            self.state.fail_unrun(step, target.quant, why_not)
            return Failed(why_not, ran=False)
        result = self.attempt(step, target.quant, title, body, account, raises=(ConfigError, WriteError))
        if server is not None:
            self.check_alive(target, server)
        elif isinstance(result, Failed) and result.unreachable:
            self._gone[target.name] = UNREACHABLE
        return result

    def run_experiments(
        self,
        target: ServedTarget,
        experiments: Sequence[Experiment],
        servers: ServerControl | None = None,
        server: LlamaServer | None = None,
    ) -> list[ExperimentOutcome]:
        """Every experiment of `experiments` against `target`, in order, under the failure rule;
        the outcome of each that was attempted."""
        outcomes: list[ExperimentOutcome] = []
        for experiment in experiments:
            body = functools.partial(self._experiment, experiment.name, target, servers)
            title = experiment.title.format(quant=target.quant)
            result = self.attempt_against(target, experiment.step, title, body, experiment_account, server)
            if isinstance(result, Failed):
                if result.ran:
                    outcome = ExperimentOutcome(target, experiment.name, None, result.why, result.unreachable)
                    outcomes.append(outcome)
                continue
            outcomes.append(ExperimentOutcome(target, experiment.name, result, result.problem))
            self.workers_missing = self.workers_missing or workers_absent(result.summaries)
        return outcomes

    def _experiment(
        self, name: str, target: ServedTarget, servers: ServerControl | None, progress: ProgressCallback
    ) -> ExperimentRun:
        return self.steps.experiment(name, target, self.context.with_progress(progress), servers)
