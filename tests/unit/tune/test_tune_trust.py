"""The tune checks what it trusts: a resumed state is read line by line (a damaged trial line is
counted and measured again, never an AssertionError), another model file's tune is refused in one
line; the times it says and the winner's command; the report's notes on torn tune files.

Tunes run with real Locust processes: tests/integration/tune/test_tune_trust_processes.py.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from quantload.analysis.tune_tables import tune_tables, tune_verdict
from quantload.errors import ConfigError
from quantload.experiments.base import ExperimentContext, ServedVariant, ServerFlags
from quantload.llamacpp.server import ServerSpec, free_port
from quantload.load.fakeserver import FakeServer
from quantload.rundir import TUNE_JSON, TUNE_JSONL
from quantload.tune.outcome import SearchCost, winner_command
from quantload.tune.search import new_search, tune_quant
from quantload.tune.space import configurations, space_key
from quantload.tune.state_file import TuneLine
from quantload.tune.tune_run import time_said
from tune_fakes import SCRIPT, TARGET, tune_context

MODEL = "tiny Q8_0-tiny.gguf sha256:0123456789abcdef"


class RecordingVariants:
    """Variants of fake servers; `dead` slot counts get a server that is gone when the trial runs."""

    def __init__(self, dead: tuple[int, ...] = ()) -> None:
        self.asked: list[ServerFlags] = []
        self.dead = dead

    @contextlib.contextmanager
    def variant(self, flags: ServerFlags) -> Iterator[ServedVariant]:
        self.asked.append(flags)
        if flags.slots in self.dead:  # killed as the trial starts: nothing listens on its port
            url = f"http://127.0.0.1:{free_port()}"
            yield ServedVariant(TARGET.model_copy(update={"url": url}), flags, None, "no KV line", "")
            return
        with FakeServer(SCRIPT) as fake:
            yield ServedVariant(TARGET.model_copy(update={"url": fake.url}), flags, None, "no KV line", "")

    def adopt(self, flags: ServerFlags) -> ServedVariant:
        raise AssertionError("not here")


def _state(tmp_path: Path, model: str = MODEL) -> tuple[Path, list[str]]:
    """A finished tune's tune.jsonl of two configurations, as its lines."""
    run = tune_context(tmp_path, baseline=False)
    configs = configurations(run.settings)
    search = new_search(run.settings, [config.key for config in configs])
    common = {"run_id": "run-1", "quant": "Q8_0", "server": "llama-q8_0", "objective": "users"}
    lines = [
        TuneLine(kind="start", model=model, space_key=space_key(run.settings, model), **common)  # type: ignore[arg-type]
    ]
    while (trial := search.next_trial()) is not None:
        line = TuneLine(kind="trial", key=trial.key, rung=trial.rung.index, limit=2.0, goodput_rps=1.0, **common)  # type: ignore[arg-type]
        search.record(line.score())
        lines.append(line)
    return tmp_path / TUNE_JSONL, [line.model_dump_json(by_alias=True) for line in lines]


def test_damaged_trial_lines_are_counted_named_and_measured_again_not_a_traceback(tmp_path: Path) -> None:
    state, lines = _state(tmp_path)
    first_trial = json.loads(lines[1])
    no_key = json.dumps({**first_trial, "key": None})
    unknown = json.dumps({**first_trial, "key": "np99 b1/1 kv-f16 fa-auto t0 cb spec-none"})
    damaged = [lines[0], no_key, '{"kind": "trial", "rung": "x"', unknown, *lines[2:]]
    state.write_text("\n".join(damaged) + "\n", encoding="utf-8")
    warned: list[str] = []
    run = dataclasses.replace(tune_context(tmp_path, baseline=False), warn=warned.append)
    servers = RecordingVariants()
    outcome = tune_quant(ExperimentContext(run, TARGET, servers), resume_from=state, model=MODEL)
    assert [flags.label.split()[1:3] for flags in servers.asked] == [["r0", "np2"]]  # measured again
    assert len(outcome.search.scores) == 3
    joined = " ".join(warned)
    assert "2 lines of tune.jsonl could not be read" in joined and "lines 2, 3" in joined
    assert "1 trial line(s) of tune.jsonl do not fit this search" in joined and "np99" in joined
    assert outcome.notes and all("\n" not in note for note in outcome.notes)


def test_the_tune_of_another_model_file_is_refused_in_one_line(tmp_path: Path) -> None:
    state, lines = _state(tmp_path, model="smollm2-135m Q8_0.gguf sha256:feedfeedfeedfeed")
    state.write_text("\n".join(lines) + "\n", encoding="utf-8")
    run = tune_context(tmp_path, baseline=False)
    with pytest.raises(ConfigError, match="is of another model file") as caught:
        tune_quant(ExperimentContext(run, TARGET, RecordingVariants()), resume_from=state, model=MODEL)
    assert "smollm2-135m" in caught.value.one_line() and "\n" not in caught.value.one_line()
    assert space_key(run.settings, MODEL) != space_key(run.settings, "another")


def test_the_grid_time_is_said_in_a_unit_that_is_never_zero() -> None:
    cost = SearchCost(trials=3, seconds=12.0, configs=2, grid_trials=2, grid_seconds=20.0, ending="done")
    said = cost.sentence()
    assert "would take about 20 s" in said and "0 min" not in said
    assert "in 12 s for 2 configurations" in said
    hours = SearchCost(trials=3, seconds=600.0, configs=40, grid_trials=40, grid_seconds=9000.0, ending="done")
    assert "about 2.5 h" in hours.sentence() and "in 10.0 min" in hours.sentence()


def test_the_winners_command_names_the_port_its_server_ran_on_never_port_0(tmp_path: Path) -> None:
    run = tune_context(tmp_path)
    config = configurations(run.settings)[0]
    spec = ServerSpec(model_path=Path("m.gguf"), alias="m-Q8_0")  # port 0: a free one was picked
    binary = Path("/opt/llama/llama-server")
    assert "--port 8123" in winner_command(spec, config, run.settings, binary, 8123)
    assert "--port 8080" in winner_command(spec, config, run.settings, binary)  # llama-server's own
    assert "--port 0" not in winner_command(spec, config, run.settings, binary)


def test_the_report_notes_a_torn_tune_jsonl_and_an_unreadable_tune_json(tmp_path: Path) -> None:
    state, lines = _state(tmp_path)
    state.write_text("\n".join(lines) + '\n{"kind": "tri\n', encoding="utf-8")
    (tmp_path / TUNE_JSON).write_text("{not json", encoding="utf-8")
    tables = tune_tables(tmp_path)
    assert any("1 line of tune.jsonl could not be read" in note for note in tables.notes)
    assert any("tune.json could not be read" in note for note in tables.notes)
    verdict = tune_verdict(tables)
    assert "tune.json could not be read" in verdict and "did not finish" not in verdict


def test_the_time_a_tune_takes_is_said_before_it_starts(tmp_path: Path) -> None:
    run = tune_context(tmp_path, budget_s=120.0)
    said = time_said(run.settings, 2)
    assert "2 quantization(s), at most about 4.0 min" in said and "(2.0 min each" in said
