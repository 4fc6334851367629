"""Reading run directories in every state: missing, torn and foreign files become notes, never errors."""

from __future__ import annotations

import json
from pathlib import Path

from quantload.analysis.run_data import load_run


def test_torn_and_foreign_lines_are_counted_and_left_out(synthetic_run: Path) -> None:
    records = synthetic_run / "records.jsonl"
    whole = records.read_text().splitlines()
    records.write_text("\n".join([*whole, '{"not": "a record"}', whole[0][:40]]) + "\n")
    run = load_run(synthetic_run)
    assert len(run.records) == len(whole)
    n = len(whole)
    named = f"2 lines of records.jsonl could not be read (torn, foreign or damaged: lines {n + 1}, {n + 2})"
    assert any(note.startswith(named) for note in run.reading_notes), run.reading_notes


def test_each_missing_file_says_why_from_run_json(synthetic_run: Path) -> None:
    state = json.loads((synthetic_run / "run.json").read_text())
    state["steps"] = [
        {"name": "quality", "quant": "Q8_0", "status": "failed", "error": "llama-perplexity was killed"},
        {"name": "speed", "quant": None, "status": "skipped", "error": "no llama-bench"},
    ]
    (synthetic_run / "run.json").write_text(json.dumps(state))
    gaps = {gap.section: gap for gap in load_run(synthetic_run).gaps}
    assert gaps["quality"].why == "the quality step for Q8_0 failed: llama-perplexity was killed"
    assert gaps["speed"].why == "the speed step was skipped: no llama-bench"
    assert gaps["kv"].why == "kv.json is absent and run.json does not mention a kv step"
    assert gaps["quality"].text().startswith("not measured: quality (quality.json): ")


def test_an_interrupted_run_names_the_step_it_never_reached(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"status": "interrupted", "steps": []}))
    run = load_run(tmp_path)
    assert {g.why for g in run.gaps} >= {"the run interrupted before the quality step"}
    assert run.records.empty and run.run_id == tmp_path.name


def test_unreadable_files_are_notes(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text("null")
    (tmp_path / "speed.json").write_text("{broken")
    (tmp_path / "manifest.json").write_text("[]")
    (tmp_path / "kv.json").write_text('{"results": {"F16": {"error": "no KV line"}}}')
    run = load_run(tmp_path)
    whys = {g.section: g.why for g in run.gaps}
    assert whys["speed"].startswith("the file could not be read")
    assert whys["model files"] == "the file could not be read: not a JSON object"
    assert run.kv is not None and run.kv.to_json()["results"] == {"F16": {"error": "no KV line"}}
    assert any(note.startswith("run.json: ") for note in run.reading_notes)
    assert run.quants() == ["F16"]


def test_a_kv_json_without_results_names_each_missing_quant(synthetic_run: Path) -> None:
    from quantload.analysis.analyze import analyze
    from quantload.analysis.prometheus_source import PromConnection
    from quantload.config import ReportSettings
    from quantload.slo import Slo

    (synthetic_run / "kv.json").write_text('{"schema": "quantload.kv/1", "results": {}}')
    run = load_run(synthetic_run)
    assert not [g for g in run.gaps if g.section == "kv"]  # the file itself was read
    analysis = analyze(run, ReportSettings(), Slo(1.0, 0.1), PromConnection(None, "", ["none"]), 1.0)
    kv_gaps = {g.what: g.why for g in analysis.gaps if g.section == "kv"}
    assert kv_gaps == {
        f"KV check of {q}": f"kv.json has no entry for {q} and run.json does not mention a kv step"
        for q in ("Q8_0", "Q4_K_M")
    }
