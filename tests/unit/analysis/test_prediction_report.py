"""The report's prediction section on synthetic run folders: predicted beside measured per level,
where they part and which part the model got wrong, a measured limit below the predicted interval
as a finding, summary.json's `prediction`, and a missing or damaged predict.json as a gap or note."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pandas as pd
from analysis_synthetic import write_synthetic_run

from quantload.analysis import build_report
from quantload.analysis.analyze import Analysis, analyze_run
from quantload.analysis.prediction_check import (
    SLOWER_UNDER_LOAD,
    TPOT_PART,
    TTFT_PART,
    prediction_checks,
)
from quantload.analysis.run_data import load_run
from quantload.config import ReportSettings
from quantload.predict import predict_file
from quantload.predict.prediction import PREDICT_SCHEMA


def _analysis(folder: Path) -> Analysis:
    return analyze_run(load_run(folder), ReportSettings())


def _level(users: int, ttft: float, tpot: float, shares: tuple[float, float, float]) -> dict[str, Any]:
    queue, prefill, decode = shares
    return {"level": users, "requests": 50, "failed_frac": 0.0, "ttft_s": ttft, "tpot_s": tpot,
            "ttft_p50_s": ttft, "tpot_p50_s": tpot, "throughput_rps": 1.0, "output_tokens_per_s": 1.0,
            "queue_share": queue, "prefill_share": prefill, "decode_share": decode, "meets": True}  # fmt: skip


def _prediction(quant: str, levels: pd.DataFrame, scale: dict[str, float], limits: tuple[int, int, int],
                shares: tuple[float, float, float] = (0.25, 0.25, 0.5)) -> dict[str, Any]:  # fmt: skip
    """A prediction of `quant` whose levels are the measured ones times `scale` (per metric), its
    interval (the slow levels) barely above the point."""
    rows = levels[levels["quant"] == quant].to_dict("records")
    point = [_level(int(r["users"]), r["ttft_at_slo_s"] * scale["ttft"], r["tpot_at_slo_s"] * scale["tpot"], shares)
             for r in rows]  # fmt: skip
    slow = [{**level, "ttft_s": level["ttft_s"] * 1.01, "tpot_s": level["tpot_s"] * 1.01} for level in point]
    limit, low, high = limits
    return {
        "label": quant, "model_path": f"/m/{quant}.gguf", "workload": "prompts", "requests_per_level": 50,
        "cost_error_rms": 0.05, "cost_confidence": 0.9,
        "flags": {"slots": 4, "ctx_per_slot": 2048, "n_batch": 2048, "n_ubatch": 512, "threads": 1,
                  "continuous_batching": True},
        "limit": {"slo": {"ttft_s": 1.0, "ttft_percentile": "p99", "tpot_s": 0.1, "tpot_percentile": "p99"},
                  "arrival": "closed", "limit": limit, "limit_low": low, "limit_high": high,
                  "levels": point, "levels_low": slow, "levels_high": point},
    }  # fmt: skip


def _write_predict(folder: Path, predictions: dict[str, Any]) -> None:
    (folder / "predict.json").write_text(json.dumps({"schema": PREDICT_SCHEMA, "predictions": predictions}))


def _add_steps(folder: Path, steps: list[dict[str, Any]]) -> None:
    run_file = folder / "run.json"
    run = json.loads(run_file.read_text())
    run["steps"] += steps
    run_file.write_text(json.dumps(run))


def _step(quant: str | None, status: str, error: str | None = None) -> dict[str, Any]:
    return {"name": "predict", "quant": quant, "status": status, "error": error, "started_unix_s": 1.0,
            "finished_unix_s": 2.0, "seconds": 1.0}  # fmt: skip


def test_the_report_puts_predicted_beside_measured_and_says_where_they_part(synthetic_run: Path) -> None:
    levels = _analysis(synthetic_run).levels
    _write_predict(synthetic_run, {
        "Q8_0": _prediction("Q8_0", levels, {"ttft": 1.0, "tpot": 1.0}, (2, 1, 3)),
        "Q4_K_M": _prediction("Q4_K_M", levels, {"ttft": 1 / 3, "tpot": 1.0}, (4, 3, 5)),
    })  # fmt: skip
    _add_steps(synthetic_run, [_step("Q8_0", "ok"), _step("Q4_K_M", "ok")])
    analysis = _analysis(synthetic_run)
    within, parted = prediction_checks(analysis.run, analysis.levels, analysis.capacity, analysis.quants,
                                       analysis.slo)  # fmt: skip
    assert within.quant == "Q8_0" and within.parted_at_users is None and within.wrong_part is None
    assert within.sentence.startswith("Predicted before the load: 2 users [1, 3]; measured: not decided")
    assert "stays within the prediction" in within.parting and [lv.users for lv in within.levels] == [1, 2]
    assert parted.parted_at_users == 1 and parted.wrong_part == TTFT_PART and parted.finding is None
    assert parted.levels[0].ttft_parts and not parted.levels[0].tpot_parts
    assert "They part from 1 user" in parted.parting and "queue 25 %, prefill 25 %, decode 50 %" in parted.parting
    paths = build_report(synthetic_run)
    report = paths.markdown.read_text()
    assert "Predicted before the load, and measured" in report
    assert "Q4_K_M: Predicted before the load: 4 users" in report and f"the model got {TTFT_PART} wrong" in report
    summary = json.loads(paths.summary.read_text())
    assert [(c["quant"], c["wrong_part"]) for c in summary["prediction"]] == [("Q8_0", None), ("Q4_K_M", TTFT_PART)]
    first = summary["prediction"][1]["levels"][0]
    assert (first["users"], first["ttft_parts"], first["tpot_parts"]) == (1, True, False)


def test_a_slow_decode_names_tpot_and_a_limit_below_the_interval_is_a_finding(synthetic_run: Path) -> None:
    analysis = _analysis(synthetic_run)
    _write_predict(synthetic_run, {"Q8_0": _prediction("Q8_0", analysis.levels, {"ttft": 1.0, "tpot": 0.5}, (4, 3, 5))})
    run = load_run(synthetic_run)
    held = [dataclasses.replace(v, max_users=1) for v in analysis.capacity]  # decided: 1 user met
    q8, q4 = prediction_checks(run, analysis.levels, held, analysis.quants, analysis.slo)
    assert q8.wrong_part == TPOT_PART and q8.decided and q8.measured_users == 1
    assert q8.finding == SLOWER_UNDER_LOAD and q8.sentence.endswith("measured: 1 (decided)")
    assert q4.not_predicted is not None and q4.sentence.startswith("not predicted: ")
    _write_predict(synthetic_run, {"Q8_0": _prediction("Q8_0", analysis.levels, {"ttft": 1.0, "tpot": 1.0}, (1, 1, 2))})
    (within, _) = prediction_checks(load_run(synthetic_run), analysis.levels, held, analysis.quants, analysis.slo)
    assert within.finding is None  # the measured limit is within the interval


def test_a_limit_the_level_budget_kept_low_is_not_a_slow_server(synthetic_run: Path) -> None:
    analysis = _analysis(synthetic_run)
    held = [dataclasses.replace(v, max_users=1) for v in analysis.capacity]  # decided: 1 user met
    prediction = _prediction("Q8_0", analysis.levels, {"ttft": 1.0, "tpot": 1.0}, (4, 3, 5))
    searched = {
        "search": {"limit": 2, "lowest_miss": 8, "undecided": [4], "ending": "found", "seconds": 300.0},
        "search_low": {"limit": 1, "undecided": [2, 4], "ending": "found", "seconds": 320.0},
        "search_high": {"limit": 2, "ending": "found", "seconds": 280.0},
    }  # fmt: skip
    _write_predict(synthetic_run, {"Q8_0": {**prediction, "limit": {**prediction["limit"], **searched}}})
    (q8, _) = prediction_checks(load_run(synthetic_run), analysis.levels, held, analysis.quants, analysis.slo)
    # 1 user is below the percentiles' interval [3, 5], but a search within its budget shows 1 to 2
    assert q8.finding is None
    assert "of which a limit search within its level budget shows 2 [1, 2], undecided at 4" in q8.sentence
    slower = {**searched, "search_low": {**searched["search_low"], "limit": 2}}
    _write_predict(synthetic_run, {"Q8_0": {**prediction, "limit": {**prediction["limit"], **slower}}})
    (q8, _) = prediction_checks(load_run(synthetic_run), analysis.levels, held, analysis.quants, analysis.slo)
    assert q8.finding == SLOWER_UNDER_LOAD  # below even what the budget was expected to show
    nothing = {"search": {"limit": None, "undecided": [1, 2], "lowest_miss": 4}, "search_low": None}
    _write_predict(synthetic_run, {"Q8_0": {**prediction, "limit": {**prediction["limit"], **nothing}}})
    (q8, _) = prediction_checks(load_run(synthetic_run), analysis.levels, held, analysis.quants, analysis.slo)
    assert "a limit search within its level budget is predicted to show no level [none, none], undecided at 1, 2" in q8.sentence


def test_a_failed_or_turned_off_step_says_not_predicted_and_why(synthetic_run: Path) -> None:
    _add_steps(synthetic_run, [_step("Q8_0", "failed", "the llama.cpp tools have no llama-batched-bench (build it)"),
                               _step("Q4_K_M", "ok")])  # fmt: skip
    run = load_run(synthetic_run)
    assert [gap.section for gap in run.gaps if gap.section == "prediction"] == ["prediction"]
    report = build_report(synthetic_run).markdown.read_text()
    assert "Q8_0: not predicted: the predict step for Q8_0 failed: the llama.cpp tools have no" in report
    off = write_synthetic_run(synthetic_run.parent / "off")
    _add_steps(off, [_step(None, "skipped", "turned off (predict.enabled = false)")])
    run = load_run(off)
    assert not [gap for gap in run.gaps if gap.section == "prediction"]  # turned off is no gap
    report = build_report(off).markdown.read_text()
    assert "not predicted: the predict step was skipped: turned off (predict.enabled = false)" in report


def test_without_a_predict_step_or_file_the_section_is_not_run(synthetic_run: Path) -> None:
    run = load_run(synthetic_run)
    assert run.predict is None and not [gap for gap in run.gaps if gap.section == "prediction"]
    analysis = _analysis(synthetic_run)
    assert prediction_checks(run, analysis.levels, analysis.capacity, analysis.quants, analysis.slo) == ()
    assert json.loads(build_report(synthetic_run).summary.read_text())["prediction"] == []


def test_a_damaged_or_oversized_predict_json_is_a_note_never_an_error(synthetic_run: Path, monkeypatch: Any) -> None:
    (synthetic_run / "predict.json").write_text('{"schema": "quantload.predict/1", "predictions": {"Q8_0": 3}}')
    run = load_run(synthetic_run)
    assert run.predict is None and any(note.startswith("predict.json could not be read") for note in run.reading_notes)
    build_report(synthetic_run)
    analysis = _analysis(synthetic_run)
    _write_predict(synthetic_run, {"Q8_0": _prediction("Q8_0", analysis.levels, {"ttft": 1.0, "tpot": 1.0}, (2, 1, 3))})
    monkeypatch.setattr(predict_file, "MAX_PREDICT_BYTES", 64)
    run = load_run(synthetic_run)
    assert run.predict is None and any("more than the 64" in note for note in run.reading_notes)
