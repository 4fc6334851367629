"""The tune checks what it trusts: a resumed state is read line by line (a damaged trial line is
counted and measured again, never an AssertionError), another model file's tune is refused in one
line; a speculating configuration that never drafted and a configuration whose server died during
its trial rank as not measured, never as recommended or as missing the SLO."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_tune_search import SCRIPT, TARGET, tune_context

from quantload.analysis.tune_tables import tune_tables, tune_verdict
from quantload.errors import ConfigError
from quantload.experiments.base import ExperimentContext, ServedVariant, ServerFlags
from quantload.llamacpp.server import ServerSpec, free_port
from quantload.load.fakeserver import FakeServer
from quantload.rundir import TUNE_JSON, TUNE_JSONL
from quantload.tune.outcome import SearchCost, ranking, winner_command
from quantload.tune.search import new_search, tune_quant
from quantload.tune.space import configurations, space_key
from quantload.tune.state_file import TuneLine, read_tune
from quantload.tune.tune_run import time_said

MODEL = "tiny Q8_0-tiny.gguf sha256:0123456789abcdef"
SCRIPT_LEVEL_SLACK_S = 6.0  # one level of the fake under way when the budget runs out, Locust's start included


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


@pytest.mark.slow
def test_a_variant_that_never_drafted_or_whose_server_died_is_not_ranked_as_measured(tmp_path: Path) -> None:
    run = tune_context(tmp_path, baseline=False, slots=[2, 4], speculation=["ngram"], finalists=2)
    servers = RecordingVariants(dead=(4,))
    outcome = tune_quant(ExperimentContext(run, TARGET, servers), model=MODEL)
    rows = {row.key.split()[0]: row for row in ranking(outcome)}
    assert not rows["np2"].ran and "not speculating: no draft token was counted" in rows["np2"].why
    assert not rows["np4"].ran and "stopped answering during the trial" in rows["np4"].why
    assert outcome.winner is None  # the fake never drafts: nothing to recommend
    lines = read_tune(tmp_path / TUNE_JSONL)
    assert [line.ran for line in lines if line.kind == "trial"] == [False, False]


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


@pytest.mark.slow
def test_the_budget_bounds_the_baseline_search_too(tmp_path: Path) -> None:
    run = tune_context(tmp_path, budget_s=6.0, short_trial_s=2.0, finalists=1)
    wide = run.settings.model_copy(
        update={"limit": run.settings.limit.model_copy(update={"max_users": 64, "time_cap_s": 3600.0})}
    )
    run = dataclasses.replace(run, settings=wide)
    started = time.monotonic()
    with FakeServer(SCRIPT) as own:
        target = TARGET.model_copy(update={"url": own.url})
        outcome = tune_quant(ExperimentContext(run, target, RecordingVariants()), model=MODEL)
    assert outcome.baseline is not None and outcome.baseline.ran
    # the baseline keeps its share of the budget, not the limit search's hour: a few levels at most
    assert outcome.baseline.seconds < 6.0 + SCRIPT_LEVEL_SLACK_S
    assert time.monotonic() - started < 2 * 6.0 + 2 * SCRIPT_LEVEL_SLACK_S


def test_the_time_a_tune_takes_is_said_before_it_starts(tmp_path: Path) -> None:
    run = tune_context(tmp_path, budget_s=120.0)
    said = time_said(run.settings, 2)
    assert "2 quantization(s), at most about 4.0 min" in said and "(2.0 min each" in said
