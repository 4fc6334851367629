"""Predict first (`tune.predict_first`): cost curves of known timing per -b/-ub and KV-cache type,
the space screened by predicted limit, speculation always measured, the screening kept in
tune.jsonl so a resume screens alike, and the dropped configurations in the ranking with their
reason. The trials are fakes that measure the known truth: no process starts."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import pytest

from load_api import context
from quantload.config import LoadSettings
from quantload.experiments.base import ExperimentContext
from quantload.llamacpp.batched_bench import (
    BatchedBenchResult,
    BatchedBenchRow,
    BatchedBenchSettings,
    batched_bench_command,
)
from quantload.predict.costs import CostCurves, CostsFile, decode_work, fit_costs, prefill_work
from quantload.run_context import RunContext
from quantload.tune import search as search_module
from quantload.tune.halving import PlannedTrial, SuccessiveHalving
from quantload.tune.outcome import ranking
from quantload.tune.predicted import (
    NOT_PREDICTED_SPECULATION,
    ConfigPrediction,
    CostFlags,
    configured_key,
    predict_space,
    screen,
)
from quantload.tune.space import TuneConfig, configurations, space_key
from quantload.tune.state_file import TuneLine, read_tune
from tune_fakes import TARGET, RecordingVariants

TRUE = (4e-3, 5e-3, 1.5e-3, 2e-6, 3e-7)  # seconds per ubatch, prompt token, decoded token, KV read, pair
# each combination's cost against TRUE: 256/256 is clearly slower, q8_0 a little
FACTOR = {("2048/512", "f16"): 1.0, ("2048/512", "q8_0"): 1.05, ("256/256", "f16"): 4.0, ("256/256", "q8_0"): 4.2}
FAST = ("np4 b2048/512 kv-f16", "np4 b2048/512 kv-q8_0", "np8 b2048/512 kv-f16", "np8 b2048/512 kv-q8_0")


def fake_costs(flags: CostFlags, noise: float = 0.05) -> CostsFile:
    """Cost curves fitted to llama-batched-bench rows of known timing (FACTOR x TRUE, with noise)."""
    factor = FACTOR[(f"{flags.n_batch}/{flags.n_ubatch}", flags.cache_type)]
    curves = CostCurves(tuple(t * factor for t in TRUE), n_batch=flags.n_batch, n_ubatch=flags.n_ubatch)
    rng = random.Random(1)
    rows = []
    for pp in (32, 128, 512):
        for pl in (1, 2, 4, 8):
            prefill = curves.work_s(prefill_work(pp, pl, flags.n_batch, flags.n_ubatch))
            decode = curves.work_s(decode_work(32, pl, pp, flags.n_ubatch))
            row = BatchedBenchRow(
                prompt_tokens=pp, gen_tokens=32, sequences=pl, kv_cells=pl * (pp + 32),
                prompt_s=prefill * (1 + rng.gauss(0, noise)), gen_s=decode * (1 + rng.gauss(0, noise)),
            )  # fmt: skip
            rows.append(row)
    settings = BatchedBenchSettings(
        n_kv_max=6144, n_batch=flags.n_batch, n_ubatch=flags.n_ubatch, flash_attn=-1, is_pp_shared=0,
        n_gpu_layers=-1, n_threads=1, n_threads_batch=1,
    )  # fmt: skip
    result = BatchedBenchResult(
        model_path="m.gguf", model_size_bytes=1, settings=settings, rows=rows, command=["llama-batched-bench"],
        wall_time_s=1.0, llama_cpp={}, measured_at="2026-12-04T15:00:00+00:00",
    )  # fmt: skip
    return fit_costs(result, quant_type="Q8_0")


class Measured:
    """The cost measurement, counting the combinations asked for."""

    def __init__(self) -> None:
        self.asked: list[CostFlags] = []

    def __call__(self, flags: CostFlags) -> CostsFile:
        self.asked.append(flags)
        return fake_costs(flags)


def run_of(tmp_path: Path, **tune: Any) -> RunContext:
    space = {
        "slots": [4, 8], "batch_sizes": ["2048/512", "256/256"], "cache_types": ["f16", "q8_0"],
        "finalists": 1, "eta": 2, "short_trial_s": 30, "budget_s": 6000, "baseline": False,
        "predict_first": True, **tune,
    }  # fmt: skip
    return context(
        tmp_path,
        tune=space,
        workload={"kind": "lengths", "input_lengths": "fixed:128", "output_lengths": "fixed:32"},
        slo={"ttft_s": 3.0, "tpot_s": 0.1, "ttft_percentile": "p90", "tpot_percentile": "p90", "level_max_s": 5},
        limit={"max_users": 12},
        # users in lockstep, as FAST was worked out for: a client's turnaround lowers 8 slots' limit
        predict={"client_turnaround_s": 0.0},
        load=LoadSettings(first_round_jitter_s=0.0),
    )


@pytest.fixture(autouse=True)
def _few_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("quantload.tune.predicted.PREDICT_REQUESTS", 200)


def _short(key: str) -> str:
    return " ".join(key.split()[:3])


def test_the_screening_keeps_the_truly_best_and_drops_the_clearly_slower(tmp_path: Path) -> None:
    run = run_of(tmp_path)
    measured = Measured()
    predictions = predict_space(run.settings, configurations(run.settings), measured)
    # one llama-batched-bench run per -b/-ub and KV-cache type, not per slot count
    assert len(measured.asked) == 4
    assert {flags.args() for flags in measured.asked} >= {("-ctk", "q8_0", "-ctv", "q8_0", "-fa", "auto")}
    screened = screen(predictions)
    assert screened.best is not None and _short(screened.best) == "np4 b2048/512 kv-f16"
    assert {_short(key) for key in screened.kept} == set(FAST)  # q8_0's interval reaches the best's
    assert len(screened.dropped) == 4
    for key, why in screened.dropped:
        assert "b256/256" in key
        found = screened.prediction(key)
        assert found is not None and found.limit_high is not None
        assert why.startswith(f"predicted limit {found.text()}, below the best's ")
        best = screened.prediction(screened.best)
        assert best is not None and best.limit_low is not None and found.limit_high < best.limit_low


def test_an_overlapping_interval_is_kept_and_the_configured_flags_always() -> None:
    predictions = [
        ConfigPrediction("a", 10, 8, 12),
        ConfigPrediction("b", 7, 5, 8),  # reaches the best's low end: not separated
        ConfigPrediction("c", 5, 3, 7),
        ConfigPrediction("d", None, None, None),  # not even one user: counts as 0
        ConfigPrediction("e", 2, 1, 3),
    ]
    screened = screen(predictions, always=["e"])
    assert screened.best == "a"
    assert screened.kept == ("a", "b", "e")
    assert screened.dropped == (
        ("c", "predicted limit 5 [3, 7], below the best's 10 [8, 12] (a)"),
        ("d", "predicted limit none [none, none], below the best's 10 [8, 12] (a)"),
    )
    # a best whose slow bound meets no level separates nothing
    assert screen([ConfigPrediction("a", 1, None, 2), ConfigPrediction("b", None, None, None)]).kept == ("a", "b")


def test_speculation_is_not_predicted_and_always_measured(tmp_path: Path) -> None:
    run = run_of(tmp_path, speculation=["none", "ngram"], batch_sizes=["256/256", "2048/512"], cache_types=["f16"])
    measured = Measured()
    predictions = predict_space(run.settings, configurations(run.settings), measured)
    spec = [p for p in predictions if "spec-ngram" in p.key]
    assert len(spec) == 4 and all(p.why == NOT_PREDICTED_SPECULATION and not p.predicted for p in spec)
    assert len(measured.asked) == 2  # the speculating ones measured no curves
    screened = screen(predictions)
    assert all(p.key in screened.kept for p in spec)  # the slow batch's too
    assert all("spec-none" in key and "b256/256" in key for key, _ in screened.dropped)


def test_the_configured_flags_are_found_in_the_space(tmp_path: Path) -> None:
    run = context(
        tmp_path,
        tune={"slots": [4, 8], "batch_sizes": ["2048/512", "256/256"]},
        server={"slots": 4, "extra_args": ["-b", "256", "-ub", "256"]},
    )
    assert configured_key(run.settings, configurations(run.settings)) == (
        "np4 b256/256 kv-f16 fa-auto t0 cb spec-none"
    )
    other = context(tmp_path, tune={"slots": [8]}, server={"slots": 4})
    assert configured_key(other.settings, configurations(other.settings)) is None


def test_batched_bench_takes_the_cache_type_and_flash_attention() -> None:
    flags = CostFlags(256, 256, 2, "q8_0", "on")
    command = batched_bench_command(
        Path("llama-batched-bench"), Path("m.gguf"), [32], [32], [1, 4], 2, 256, 256, (), flags.args()
    )
    assert command[-8:] == ["-t", "2", "-ctk", "q8_0", "-ctv", "q8_0", "-fa", "on"]


# the truth the fake trials measure: the 2048/512 batch holds 4 users, 256/256 one; the 4-slot f16
# configuration has the most goodput
def _truth(config: TuneConfig) -> tuple[float, float]:
    fast = config.batch == "2048/512"
    goodput = 2.0 if (fast and config.slots == 4 and config.cache_type == "f16") else 1.0
    return (4.0 if fast else 1.0), goodput


def _fake_trials(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    ran: list[str] = []

    def trial(context: ExperimentContext, config: TuneConfig, planned: PlannedTrial, _: SuccessiveHalving) -> TuneLine:
        ran.append(config.key)
        limit, goodput = _truth(config)
        return TuneLine(
            kind="trial", run_id=context.run.run_id, quant=TARGET.quant, server=TARGET.name, key=config.key,
            rung=planned.rung.index, limit=limit, lowest_miss=limit + 1, goodput_rps=goodput, seconds=10.0,
            objective="users",
        )  # fmt: skip

    monkeypatch.setattr(search_module, "_run_trial", trial)
    return ran


def test_a_tune_that_predicts_first_measures_the_kept_and_ranks_the_dropped_with_their_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = _fake_trials(monkeypatch)
    run = run_of(tmp_path)
    measured = Measured()
    outcome = search_module.tune_quant(ExperimentContext(run, TARGET, RecordingVariants()), None, "m", measured)
    assert {_short(key) for key in ran} == set(FAST)  # the slow batch never ran
    assert outcome.winner is not None and _short(outcome.winner.key) == "np4 b2048/512 kv-f16"
    assert len(outcome.configs) == 8 and len(outcome.search.keys) == 4
    rows = ranking(outcome)
    screened = [row for row in rows if row.screened]
    assert len(rows) == 8 and len(screened) == 4 and rows[-4:] == screened
    for row in screened:
        assert "b256/256" in row.key and not row.ran and row.rung == -1
        assert row.why.startswith("screened out by prediction: predicted limit 1 [1, 1], below the best's")
    assert all(row.predicted_limit is not None for row in rows)
    lines = read_tune(run.run_dir.tune_state_path)
    assert [line.kind for line in lines[:9]] == ["start"] + ["screen"] * 8
    assert sum(1 for line in lines if line.kind == "screen" and not line.kept) == 4

    # a resume screens as the first tune did, from its lines: no costs measured again, nothing re-run
    again = Measured()
    ran.clear()
    resumed = search_module.tune_quant(
        ExperimentContext(run, TARGET, RecordingVariants()), run.run_dir.tune_state_path, "m", again
    )
    assert again.asked == [] and ran == []
    assert resumed.screening == outcome.screening
    assert resumed.winner == outcome.winner


def test_predict_first_off_measures_every_configuration_and_no_costs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ran = _fake_trials(monkeypatch)
    run = run_of(tmp_path, predict_first=False)

    def never(flags: CostFlags) -> CostsFile:
        raise AssertionError("no costs without tune.predict_first")

    outcome = search_module.tune_quant(ExperimentContext(run, TARGET, RecordingVariants()), None, "m", never)
    assert len(set(ran)) == 8 and outcome.screening is None
    assert not any(row.screened for row in ranking(outcome))
    assert all(line.kind != "screen" for line in read_tune(run.run_dir.tune_state_path))
    # the state's key of a tune without it is the key tunes had before the option existed
    dumped = run.settings.model_dump(mode="json")
    assert "predict_first" in dumped["tune"]
    assert space_key(run.settings, "m") != space_key(run_of(tmp_path).settings, "m")
