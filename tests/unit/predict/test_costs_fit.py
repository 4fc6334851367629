"""Cost curves: the work each llama-batched-bench row stands for, the fit on synthetic rows of
known coefficients, the (low, high) interval, costs.json, and the inputs that cannot be fitted."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from quantload.errors import MeasurementError
from quantload.llamacpp.batched_bench import BatchedBenchResult, BatchedBenchRow, BatchedBenchSettings
from quantload.llamacpp.bench import BenchRecord
from quantload.predict.batch_cost import BatchCost
from quantload.predict.costs import (
    TERMS,
    CostCurves,
    Work,
    batched_bench_observations,
    decode_work,
    fit_costs,
    load_costs_file,
    prefill_work,
    write_costs_file,
)

# seconds per ubatch, prompt token, decoded token, KV token read by a decoded token, prompt pair
TRUE = (4e-3, 5e-3, 1.5e-3, 2e-6, 3e-7)
CURVES = CostCurves(TRUE, n_batch=2048, n_ubatch=512)
SETTINGS = BatchedBenchSettings(
    n_kv_max=6144, n_batch=2048, n_ubatch=512, flash_attn=-1, is_pp_shared=0, n_gpu_layers=-1,
    n_threads=1, n_threads_batch=1,
)  # fmt: skip


def _rows(noise: float = 0.0, seed: int = 1) -> list[BatchedBenchRow]:
    rng = random.Random(seed)
    rows = []
    for pp in (32, 128, 512):
        for pl in (1, 2, 4, 8):
            prefill = CURVES.work_s(prefill_work(pp, pl, 2048, 512)) * (1 + rng.gauss(0, noise))
            decode = CURVES.work_s(decode_work(32, pl, pp, 512)) * (1 + rng.gauss(0, noise))
            row = BatchedBenchRow(
                prompt_tokens=pp, gen_tokens=32, sequences=pl, kv_cells=pl * (pp + 32),
                prompt_s=prefill, gen_s=decode,
            )  # fmt: skip
            rows.append(row)
    return rows


def _result(rows: list[BatchedBenchRow]) -> BatchedBenchResult:
    return BatchedBenchResult(
        model_path="smollm2-Q4_K_M.gguf", model_size_bytes=105_454_144, settings=SETTINGS, rows=rows,
        command=["llama-batched-bench"], wall_time_s=1.0,
        llama_cpp={"binary_version": "version: 0.6.0-dev (build 0, commit unknown)"},
        measured_at="2026-12-04T15:00:00+00:00",
    )  # fmt: skip


def test_each_row_is_its_prefill_and_its_decode_steps() -> None:
    row = BatchedBenchRow(
        prompt_tokens=512, gen_tokens=32, sequences=8, kv_cells=4352, prompt_s=9.0, gen_s=2.0
    )
    prefill, decode = batched_bench_observations([row], 2048, 512)
    # 4096 prompt tokens: two calls of 2048, four ubatches each; 8 x 512*513/2 attention pairs
    assert prefill.work == Work(ubatches=8, prompt_tokens=4096, prompt_pairs=8 * 512 * 513 / 2)
    # 32 calls of 8 tokens; before step i the 8 sequences hold 8*(512+i) tokens
    assert decode.work == Work(
        ubatches=32, decode_tokens=256, decode_kv_tokens=8 * sum(512 + i for i in range(32))
    )
    assert (prefill.seconds, decode.seconds) == (9.0, 2.0)


def test_the_fit_recovers_known_coefficients_within_one_percent() -> None:
    costs = fit_costs(_result(_rows()), quant_type="Q4_K_M")
    for term, true in zip(TERMS, TRUE, strict=True):
        assert costs.fit.coefficients[term] == pytest.approx(true, rel=0.01), term
    assert costs.fit.relative_rms < 1e-6 and costs.fit.observations == 24
    assert costs.build_number == 0 and costs.n_threads == 1


def test_the_fit_with_llama_bench_records_of_the_same_setting() -> None:
    def record(n_prompt: int, n_gen: int) -> BenchRecord:
        work = prefill_work(n_prompt, 1, 2048, 512) if n_prompt else decode_work(n_gen, 1, 0, 512)
        return BenchRecord(
            build_commit="unknown", build_number=0, model_filename="m", model_type="llama ?B Q4_K - Medium",
            model_size=1, model_n_params=1, n_batch=2048, n_ubatch=512, n_threads=1, type_k="f16",
            type_v="f16", n_gpu_layers=-1, flash_attn=-1, n_prompt=n_prompt, n_gen=n_gen,
            test_time="t", avg_ns=round(CURVES.work_s(work) * 1e9), stddev_ns=0, avg_ts=1.0,
            stddev_ts=0.0, samples_ns=[], samples_ts=[],
        )  # fmt: skip

    costs = fit_costs(_result(_rows()), "Q4_K_M", [record(256, 0), record(0, 64)])
    assert costs.fit.observations == 26 and costs.fit.relative_rms < 1e-6
    other = record(256, 0).model_copy(update={"n_threads": 2})
    with pytest.raises(MeasurementError, match="-b/-ub/-t"):
        fit_costs(_result(_rows()), "Q4_K_M", [other])


def test_the_interval_brackets_noisy_measurements() -> None:
    costs = fit_costs(_result(_rows(noise=0.05)), quant_type="Q4_K_M")
    assert 0.02 < costs.fit.relative_rms < 0.1
    assert all(error > 0 for error in costs.fit.stderr.values())
    curves = costs.curves()
    low, high = curves.bounds(0.99)
    inside = 0
    for observation in batched_bench_observations(costs.batched_bench.rows, 2048, 512):
        assert low.work_s(observation.work) < curves.work_s(observation.work) < high.work_s(observation.work)
        inside += low.work_s(observation.work) <= observation.seconds <= high.work_s(observation.work)
    assert inside >= 22  # of 24
    narrow_low, narrow_high = curves.bounds(0.5)
    assert low.batch_s(0, 4, 1000) < narrow_low.batch_s(0, 4, 1000) < narrow_high.batch_s(0, 4, 1000)
    assert curves.scaled(2.0).batch_s(64, 2, 300) == pytest.approx(2 * curves.batch_s(64, 2, 300))
    with pytest.raises(ValueError, match="confidence"):
        curves.bounds(1.0)


def test_batch_seconds_follow_the_terms() -> None:
    curve: BatchCost = CURVES
    assert curve.batch_s(0, 0, 0) == 0.0
    one = curve.batch_s(0, 1, 100)
    assert one == pytest.approx(TRUE[0] + TRUE[2] + 100 * TRUE[3])
    assert curve.batch_s(0, 8, 800) > curve.batch_s(0, 4, 400) > one
    assert curve.batch_s(100, 0, 0) == pytest.approx(TRUE[0] + 100 * TRUE[1] + 5050 * TRUE[4])
    # a later chunk of a prompt attends the tokens its sequence holds
    assert curve.batch_s(100, 0, 1000) == pytest.approx(curve.batch_s(100, 0, 0) + 100_000 * TRUE[4])
    assert curve.batch_s(1024, 0, 0) - curve.batch_s(1023, 0, 0) > TRUE[0]  # a third ubatch


def test_costs_json_round_trips(tmp_path: Path) -> None:
    costs = fit_costs(_result(_rows(noise=0.02)), quant_type="Q4_K_M")
    path = tmp_path / "costs.json"
    write_costs_file(path, costs)
    data = json.loads(path.read_text())
    assert data["schema"] == "quantload.costs/1" and data["quant_type"] == "Q4_K_M"
    assert len(data["batched_bench"]["rows"]) == 12 and set(data["fit"]["coefficients"]) == set(TERMS)
    again = load_costs_file(path)
    assert again == costs and again.curves() == costs.curves()
    path.write_text(json.dumps({**data, "schema": "quantload.costs/0"}))
    with pytest.raises(ValueError):
        load_costs_file(path)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([], "no rows"),
        (_rows()[:1], "more than 5 observations, got 2"),
        ([row for row in _rows() if row.prompt_tokens == 128], "cannot separate the five cost terms"),
    ],
)
def test_rows_that_cannot_be_fitted_say_so_in_one_line(rows: list[BatchedBenchRow], message: str) -> None:
    with pytest.raises(MeasurementError, match=message) as caught:
        fit_costs(_result(rows), quant_type="Q4_K_M")
    assert "\n" not in caught.value.one_line()


def test_a_row_of_zero_seconds_is_refused() -> None:
    rows = _rows()
    rows[0] = rows[0].model_copy(update={"gen_s": 0.0})
    with pytest.raises(
        MeasurementError, match="positive measured seconds; batched-bench pp32 tg32 B1 decode"
    ):
        fit_costs(_result(rows), quant_type="Q4_K_M")


def test_the_measured_smollm2_curves_load_and_grow_with_sequences() -> None:
    path = Path(__file__).resolve().parents[2] / "fixtures" / "predict" / "smollm2-q4_k_m-costs.json"
    costs = load_costs_file(path)
    assert costs.quant_type == "Q4_K_M" and costs.batched_bench.runs == 3 and costs.fit.relative_rms < 0.15
    curves = costs.curves()
    steps = [curves.batch_s(0, n, n * 256) for n in (1, 2, 4, 8)]
    assert steps == sorted(steps) and 0.005 < steps[0] < 0.05
