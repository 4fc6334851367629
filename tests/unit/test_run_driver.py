"""The run driver's one failure rule over fake steps: a failed measurement is recorded and the next
experiment runs; a server that is gone fails only its own remaining experiments; a ConfigError is
recorded and raised; the state is run.json or memory, as the command asks."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quantload.cli.main import main
from quantload.config import Settings
from quantload.errors import ConfigError, MeasurementError, ServerError
from quantload.experiments import registry
from quantload.experiments.base import ExperimentRun
from quantload.served import ServedTarget
from quantload.stack import run_steps
from quantload.stack.run_driver import DIED, UNREACHABLE, RunDriver, RunPlace
from quantload.stack.run_steps import RunSteps

EXPERIMENTS = [registry.get(name) for name in ("sweep", "prefix_cache", "open_loop")]
A = ServedTarget(name="a", quant="Q8_0", url="http://127.0.0.1:9")
B = ServedTarget(name="b", quant="Q4_K_M", url="http://127.0.0.1:10")


class Silent:
    """A RunView that keeps its messages."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def step(self, title: str) -> Callable[..., None]:
        return lambda *args, **kwargs: None

    def message(self, text: str) -> None:
        self.lines.append(text)


class ScriptedSteps(RunSteps):
    """Each experiment a call in `calls`; `fail` maps "<experiment> <target>" to what it raises."""

    def __init__(self, fail: dict[str, BaseException] | None = None) -> None:
        super().__init__(Settings(), {}, Path("/nonexistent-cache"))
        self.fail = fail or {}
        self.calls: list[str] = []

    def experiment(self, experiment: str, target: ServedTarget, context: Any, servers: Any) -> ExperimentRun:
        call = f"{experiment} {target.name}"
        self.calls.append(call)
        if call in self.fail:
            raise self.fail[call]
        return ExperimentRun(experiment, (), busy_s=1.0)


class Server:
    """Quacks like LlamaServer: alive until `lives` experiments have run."""

    def __init__(self, steps: ScriptedSteps, lives: int) -> None:
        self.steps, self.lives = steps, lives

    def alive(self) -> bool:
        return len(self.steps.calls) < self.lives

    def stop(self) -> int | None:
        return -9


def _driver(tmp_path: Path, steps: ScriptedSteps, record: bool = False) -> tuple[RunDriver, Silent]:
    view = Silent()
    return RunDriver(RunPlace(tmp_path, "run-1", tmp_path, {}), Settings(), view, steps, record), view


def _steps(driver: RunDriver) -> list[tuple[str, str | None, str, str | None]]:
    return [(s.name, s.quant, s.status or "", s.error) for s in driver.state.steps()]


def test_a_failed_measurement_is_recorded_and_the_next_experiment_runs(tmp_path: Path) -> None:
    steps = ScriptedSteps({"prefix_cache a": MeasurementError("no stage ended", "see stages.jsonl")})
    driver, view = _driver(tmp_path, steps)
    outcomes = driver.run_experiments(A, EXPERIMENTS)
    assert steps.calls == ["sweep a", "prefix_cache a", "open_loop a"]
    assert [o.failure for o in outcomes] == [None, "no stage ended (see stages.jsonl)", None]
    assert driver.failures() == ["prefix_cache Q8_0: no stage ended (see stages.jsonl)"]
    assert any("failed: no stage ended" in line for line in view.lines)


def test_a_server_that_stops_answering_fails_its_own_remaining_experiments_only(tmp_path: Path) -> None:
    steps = ScriptedSteps({"sweep a": ServerError("connection refused")})
    driver, _ = _driver(tmp_path, steps)
    outcomes = driver.run_experiments(A, EXPERIMENTS) + driver.run_experiments(B, EXPERIMENTS)
    assert steps.calls == ["sweep a", "sweep b", "prefix_cache b", "open_loop b"]
    assert [(o.target.name, o.unreachable) for o in outcomes] == [("a", True), ("b", False), ("b", False),
                                                                  ("b", False)]  # fmt: skip
    assert _steps(driver)[:3] == [
        ("load", "Q8_0", "failed", "connection refused"),
        ("prefix_cache", "Q8_0", "failed", UNREACHABLE),
        ("open_loop", "Q8_0", "failed", UNREACHABLE),
    ]
    assert driver.is_gone(A) and not driver.is_gone(B)


def test_a_server_quantload_started_that_died_fails_the_rest_and_is_recorded_died(tmp_path: Path) -> None:
    steps = ScriptedSteps()
    driver, view = _driver(tmp_path, steps, record=True)
    driver.run_experiments(A, EXPERIMENTS, server=Server(steps, lives=0))  # type: ignore[arg-type]
    assert steps.calls == ["sweep a"]
    assert [(name, error) for name, _, _, error in _steps(driver)] == [
        ("load", None), ("prefix_cache", DIED), ("open_loop", DIED)
    ]  # fmt: skip
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["servers"]["Q8_0"] == {**run["servers"]["Q8_0"], "status": "died", "exit_code": -9}
    assert any("died" in line for line in view.lines)


def test_a_config_error_in_an_experiment_is_recorded_and_raised(tmp_path: Path) -> None:
    steps = ScriptedSteps({"prefix_cache a": ConfigError("trace.path does not exist", "give a JSONL trace")})
    driver, _ = _driver(tmp_path, steps)
    with pytest.raises(ConfigError):
        driver.run_experiments(A, EXPERIMENTS)
    assert steps.calls == ["sweep a", "prefix_cache a"]
    assert _steps(driver)[-1][2:] == ("failed", "trace.path does not exist (give a JSONL trace)")


def test_anything_else_is_recorded_and_raised(tmp_path: Path) -> None:
    steps = ScriptedSteps({"sweep a": KeyError("bug")})
    driver, _ = _driver(tmp_path, steps, record=True)
    with pytest.raises(KeyError):
        driver.run_experiments(A, EXPERIMENTS)
    driver.finish("failed")
    run = json.loads((tmp_path / "run.json").read_text())
    assert run["status"] == "failed" and run["steps"][0]["error"] == "KeyError: 'bug'"


def test_a_state_kept_in_memory_writes_no_run_json(tmp_path: Path) -> None:
    driver, _ = _driver(tmp_path, ScriptedSteps())
    driver.run_experiments(A, EXPERIMENTS)
    driver.finish("finished")
    assert not (tmp_path / "run.json").exists() and driver.failures() == []
    assert driver.context.run_id == "run-1" and driver.context.run_dir.path == tmp_path


def test_quantload_load_goes_on_after_a_failed_experiment_and_exits_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    ran: list[str] = []

    def stand_in(name: str, *args: Any, **kwargs: Any) -> ExperimentRun:
        ran.append(name)
        if name == "sweep":
            raise MeasurementError("the load process ended early", "see logs/locust-0.log")
        return ExperimentRun(name, (), busy_s=0.0)

    monkeypatch.setattr(run_steps, "run_experiment", stand_in)
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "o"
    argv = ["load", "--url", "http://127.0.0.1:9", "--out", str(out), "-e", "sweep", "-e", "open_loop", "--rates", "1"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 1 and ran == ["sweep", "open_loop"], err
    assert "error: server0 (unknown) sweep: the load process ended early (see logs/locust-0.log)" in err
    assert json.loads((out / "load-summary.json").read_text()) is not None  # what did run is kept
    assert not (out / "run.json").exists()  # --out may hold a run's own
