"""Whole reports from synthetic run directories: files, figures against the raw records, gaps,
the CLI and the comparison. (Reports of real runs: tests/integration/test_report.py.)"""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from analysis_synthetic import write_synthetic_run

from quantload.analysis import ReportError, build_report, compare_runs
from quantload.cli.main import main
from quantload.llamacpp.server import free_port


def strict_json(path: Path) -> Any:
    def refuse(name: str) -> None:
        raise ValueError(f"{name} in {path.name}")

    return json.loads(path.read_text(), parse_constant=refuse)


def table_rows(path: Path) -> dict[str, dict[str, str]]:
    with path.open(newline="") as handle:
        return {row["quant"]: row for row in csv.DictReader(handle)}


def p99_of_the_level(run_dir: Path, quant: str, users: int) -> float:
    """A level's TTFT p99 from its repeats' requests together."""
    values: list[float] = []
    for line in (run_dir / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["quant"] == quant and record["stage_users"] == users and record["experiment"] == "sweep":
            values.append(record["ttft_s"])
    return float(np.percentile(values, 99, method="linear"))


def test_report_files_and_the_table_match_the_records(synthetic_run: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    paths = build_report(synthetic_run, dead)
    for path in paths.all():
        assert path.is_file() and path.stat().st_size > 0
    assert {p.name for p in paths.plots} == {
        "ttft_vs_concurrency.png", "throughput_vs_concurrency.png", "latency_vs_throughput.png",
    }  # fmt: skip
    rows = table_rows(paths.csv)
    assert list(rows) == ["Q8_0", "Q4_K_M"]
    for quant in rows:
        for users in (1, 2):
            expected = p99_of_the_level(synthetic_run, quant, users)
            assert float(rows[quant][f"ttft_p99_s_at_{users}_users"]) == pytest.approx(expected, rel=1e-5)
    assert rows["Q8_0"]["perplexity"] == "" and rows["Q8_0"]["file_size_bytes"] == ""
    summary = strict_json(paths.summary)
    assert summary["schema"] == "quantload.report/1"
    whats = " | ".join(g["what"] + ": " + g["why"] for g in summary["not_measured"])
    assert "quality (quality.json)" in whats and "server time series" in whats
    assert f"the Prometheus the report was given at {dead} is not usable" in whats
    assert "the run had no Prometheus: prometheus not installed" in whats
    assert summary["percentile_method"]["numpy_method"] == "linear"
    html = paths.html.read_text()
    assert html.count("data:image/png;base64,") == 3 and 'id="quant-table"' in html
    markdown = paths.markdown.read_text()
    advice = "install Prometheus" if shutil.which("prometheus") is None else "pass --prometheus URL"
    assert "not measured: quality (quality.json)" in markdown and advice in markdown


def test_a_folder_that_is_not_a_run_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="holds none of"):
        build_report(tmp_path)
    with pytest.raises(ReportError, match="is not a folder"):
        build_report(tmp_path / "missing")


def test_a_run_with_nothing_but_run_json_still_reports(tmp_path: Path) -> None:
    (tmp_path / "run.json").write_text(json.dumps({"run_id": "r", "status": "interrupted", "steps": []}))
    paths = build_report(tmp_path)
    assert paths.plots == () and paths.not_measured >= 5
    assert "the run interrupted before the load step" in paths.markdown.read_text()


def test_cli_report_and_compare(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run_a = write_synthetic_run(tmp_path / "run-a", seed=1)
    run_b = write_synthetic_run(tmp_path / "run-b", seed=2)
    assert main(["report", str(run_a), "--slo-ttft-p99", "0.2", "--slo-tpot", "0.05"]) == 0
    assert "report: " in capsys.readouterr().out
    assert strict_json(run_a / "summary.json")["slo"]["ttft_s"] == 0.2
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "is not a folder" in capsys.readouterr().err
    assert main(["report"]) == 2
    out = tmp_path / "cmp"
    assert main(["report", "--compare", str(run_a), str(run_b), "--out", str(out)]) == 0
    assert (out / "compare.html").is_file() and (out / "compare.md").is_file()
    build_report(run_b)
    a, b = table_rows(run_a / "table.csv"), table_rows(run_b / "table.csv")
    with (out / "compare.csv").open(newline="") as handle:
        deltas = {(r["quant"], r["metric"]): r for r in csv.DictReader(handle)}
    row = deltas[("Q4_K_M", "TTFT p99 @2u")]
    expected = float(b["Q4_K_M"]["ttft_p99_s_at_2_users"]) - float(a["Q4_K_M"]["ttft_p99_s_at_2_users"])
    assert float(row["delta"]) == pytest.approx(expected, rel=1e-4)
    # better is decided on the two levels' requests, never read off the delta
    decided = row["decided"]
    assert "requests, bootstrap 95%" in decided
    assert row["better"] == ("" if decided.startswith("no difference") else ("B" if "B beats A" in decided else "A"))
    assert deltas[("Q8_0", "perplexity")]["delta"] == ""


def test_compare_api_defaults_to_a_folder_in_the_working_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    paths = compare_runs(write_synthetic_run(tmp_path / "a"), write_synthetic_run(tmp_path / "b", seed=3))
    assert paths.html.parent == tmp_path / "compare-a-vs-b"


def test_open_loop_latency_counts_from_the_intended_send(tmp_path: Path) -> None:
    run_dir = write_synthetic_run(tmp_path / "run", quants=("Q8_0",), open_loop_rates=(2.0,))
    paths = build_report(run_dir)
    (level,) = strict_json(paths.summary)["open_loop_levels"]
    together: list[float] = []
    for line in (run_dir / "records.jsonl").read_text().splitlines():
        record = json.loads(line)
        if record["experiment"] == "open_loop":
            together.append(record["ttft_from_intended_s"])
    expected = float(np.percentile(together, 99, method="linear"))
    assert level["rate_rps"] == 2.0 and level["ttft_from_intended_p99_s"] == pytest.approx(expected)
    low, high = level["ttft_from_intended_p99_s_ci"]  # its distribution-free interval
    assert low is not None and low <= expected and (high is None or high >= expected)
    assert "## Open loop (Poisson arrivals)" in paths.markdown.read_text()
