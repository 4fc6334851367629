"""The run's predict step without llama-batched-bench: RunSteps.predict measures (here the stored
SmolLM2 curves stand in for the tool), writes costs-<quant>.json and adds each file to predict.json;
the most users it simulates; predict.json read back, bounded, and a damaged one replaced."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from quantload.config import Settings
from quantload.errors import ToolchainError
from quantload.predict import in_run, predict_file
from quantload.predict.costs import CostsFile, load_costs_file
from quantload.predict.in_run import PREDICT_MAX_USERS, users_to_predict
from quantload.predict.prediction import PREDICT_SCHEMA
from quantload.rundir import read_json
from quantload.stack.run_steps import RunSteps

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures"
SMOLLM2_COSTS = FIXTURES / "predict" / "smollm2-q4_k_m-costs.json"


def _settings(**sections: dict[str, object]) -> Settings:
    costs = load_costs_file(SMOLLM2_COSTS)  # the server's flags as the curves were measured
    base: dict[str, dict[str, object]] = {
        "server": {"slots": 4, "ctx_per_slot": 2048, "threads": costs.n_threads},
        "load": {"users": (1, 2), "max_prompt_tokens": 200, "max_tokens": 16},
        "limit": {"max_users": 3},
        "predict": {"requests_per_level": 50},
    }
    for name, values in sections.items():
        base[name] = {**base.get(name, {}), **values}
    return Settings.model_validate(base)


def test_the_most_users_is_the_larger_of_the_search_and_the_sweep_capped() -> None:
    assert users_to_predict(_settings()) == 3
    assert users_to_predict(_settings(load={"users": (1, 8)})) == 8
    assert users_to_predict(_settings(limit={"max_users": 500})) == PREDICT_MAX_USERS


def test_the_step_writes_each_files_curves_and_merges_its_prediction(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    measured: list[tuple[Any, ...]] = []

    def fake_measure(toolchain: Any, model: Path, npp: Any, ntg: Any, npl: Any, threads: int, n_batch: int,
                     n_ubatch: int, **kwargs: Any) -> CostsFile:  # fmt: skip
        measured.append((model.name, tuple(npl), threads, n_batch, n_ubatch, kwargs["repeats"]))
        return load_costs_file(SMOLLM2_COSTS)

    monkeypatch.setattr(in_run, "measure_costs", fake_measure)
    settings = _settings()
    steps = RunSteps(settings, {}, tmp_path / "cache")
    shapes = steps.predict_workload(tmp_path)
    notes: list[str] = []
    for quant in ("Q8_0", "Q4_K_M"):
        prediction = steps.predict(
            object(), tmp_path / f"m-{quant}.gguf", quant, shapes, tmp_path,  # type: ignore[arg-type]
            lambda done, total, note="": notes.append(note),
        )  # fmt: skip
        assert prediction.label == quant and (tmp_path / f"costs-{quant}.json").is_file()
    assert [m[0] for m in measured] == ["m-Q8_0.gguf", "m-Q4_K_M.gguf"]
    assert measured[0][1:] == ((1, 2, 4), settings.server.threads, 2048, 512, settings.predict.repeats)
    body = read_json(tmp_path / "predict.json")
    assert body["schema"] == PREDICT_SCHEMA and list(body["predictions"]) == ["Q8_0", "Q4_K_M"]
    read = predict_file.load_predict_file(tmp_path / "predict.json")
    q4 = read.predictions["Q4_K_M"]
    assert q4.requests_per_level == settings.predict.requests_per_level
    assert max(level.level for level in q4.limit.levels) <= users_to_predict(settings)
    assert any("predicted limit" in note or "not even 1 user" in note for note in notes)


def test_the_default_threads_are_the_count_the_tool_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    costs = load_costs_file(SMOLLM2_COSTS)
    monkeypatch.setattr(in_run, "measure_costs", lambda *args, **kwargs: costs)
    steps = RunSteps(_settings(server={"threads": 0}), {}, tmp_path / "cache")
    prediction = steps.predict(object(), tmp_path / "m.gguf", "Q8_0", steps.predict_workload(tmp_path), tmp_path,  # type: ignore[arg-type]
                               lambda *a, **k: None)  # fmt: skip
    assert prediction.flags.threads == costs.n_threads


def test_a_missing_tool_is_the_steps_typed_failure(tmp_path: Path) -> None:
    class NoBench:
        def path(self, name: str) -> Path:
            raise ToolchainError(f"the llama.cpp tools have no {name}", "build it")

    steps = RunSteps(_settings(), {}, tmp_path / "cache")
    shapes = steps.predict_workload(tmp_path)
    with pytest.raises(ToolchainError, match="no llama-batched-bench"):
        steps.predict(NoBench(), tmp_path / "m.gguf", "Q8_0", shapes, tmp_path, lambda *a, **k: None)  # type: ignore[arg-type]
    assert not (tmp_path / "predict.json").exists()


def test_a_damaged_predict_json_is_replaced_and_one_too_large_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "predict.json"
    path.write_text("{ not json")
    with pytest.raises(ValueError):
        predict_file.load_predict_file(path)
    monkeypatch.setattr(in_run, "measure_costs", lambda *args, **kwargs: load_costs_file(SMOLLM2_COSTS))
    steps = RunSteps(_settings(), {}, tmp_path / "cache")
    steps.predict(object(), tmp_path / "m.gguf", "Q8_0", steps.predict_workload(tmp_path), tmp_path,  # type: ignore[arg-type]
                  lambda *a, **k: None)  # fmt: skip
    assert list(predict_file.load_predict_file(path).predictions) == ["Q8_0"]
    monkeypatch.setattr(predict_file, "MAX_PREDICT_BYTES", 100)
    with pytest.raises(ValueError, match="more than the 100"):
        predict_file.load_predict_file(path)
    path.write_text('{"schema": "quantload.speed/1", "results": {}}')
    with pytest.raises(ValueError, match=r"not quantload\.predict/1"):
        predict_file.load_predict_file(path)
