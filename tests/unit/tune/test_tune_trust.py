"""The tune checks what it trusts: another model file's tune is refused in one line; the times it
says and the winner's command; the report's notes on torn tune files.

Tunes run with real Locust processes (a damaged trial line of a resumed state counted, named and
measured again, never an AssertionError, among them): tests/integration/tune/test_tune_trust_processes.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from quantload.analysis.tune_tables import tune_tables, tune_verdict
from quantload.errors import ConfigError
from quantload.experiments.base import ExperimentContext
from quantload.llamacpp.server import ServerSpec
from quantload.rundir import TUNE_JSON
from quantload.tune.outcome import SearchCost, winner_command
from quantload.tune.search import tune_quant
from quantload.tune.space import configurations, space_key
from quantload.tune.tune_run import time_said
from tune_fakes import MODEL, TARGET, RecordingVariants, finished_state, tune_context


def test_the_tune_of_another_model_file_is_refused_in_one_line(tmp_path: Path) -> None:
    state, lines = finished_state(tmp_path, model="smollm2-135m Q8_0.gguf sha256:feedfeedfeedfeed")
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
    hours = SearchCost(
        trials=3, seconds=600.0, configs=40, grid_trials=40, grid_seconds=9000.0, ending="done"
    )
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
    state, lines = finished_state(tmp_path)
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
