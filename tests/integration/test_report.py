"""`quantload report` on run directories made by the project's own `quantload run`.

The shared session fixture `ci_run` (tests/conftest.py) is one real `quantload run --model tiny
--profile ci` (prepare, quality, speed and roofline, then per quantization: llama-server, KV
check, concurrency sweep, prompt-cache experiment; exporter and Prometheus watching).
Incomplete variants are copies with files deleted. Assertions compare the report with the run's
own files (records, quality.json, ...), never with numbers typed here.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from quantload.analysis import ReportPaths, build_report
from quantload.analysis.prometheus_source import prometheus_how
from quantload.cli.main import main
from quantload.config import ReportSettings
from quantload.llamacpp.server import free_port
from quantload.load.records import iter_records
from support import gaps_besides_the_absent_gpu, require_binary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip
# ---------------------------------------------------------------------------------------- fixtures


@pytest.fixture
def run_copy(ci_run: Path, tmp_path: Path) -> Path:
    """A private copy of the shared `quantload run` (reports write into it; variants delete from it)."""
    copy = tmp_path / ci_run.name
    shutil.copytree(ci_run, copy)
    state = json.loads((copy / "run.json").read_text())
    if state["prometheus"].get("data_dir"):
        state["prometheus"]["data_dir"] = str(copy / "prometheus")
    (copy / "run.json").write_text(json.dumps(state))
    return copy


def has_prometheus_data(run_dir: Path) -> bool:
    return (run_dir / "prometheus" / "data" / "wal").is_dir()


def jsonl(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def table(paths: ReportPaths) -> dict[str, dict[str, str]]:
    with paths.csv.open(newline="") as handle:
        return {row["quant"]: row for row in csv.DictReader(handle)}


def summary_of(paths: ReportPaths) -> dict[str, object]:
    def refuse(name: str) -> None:
        raise ValueError(f"{name} in summary.json")

    data = json.loads(paths.summary.read_text(), parse_constant=refuse)
    assert isinstance(data, dict)
    return data


def level_percentile(run_dir: Path, quant: str, users: int, q: float) -> float:
    """Recomputed from the raw files: the exact percentile of the level's complete stages' requests
    together."""
    complete = {
        e["stage_id"]
        for e in jsonl(run_dir / "stages.jsonl")
        if e["event"] == "stage_end" and e["status"] == "ok"
    }
    per_stage: dict[str, list[float]] = {}
    for r in iter_records(run_dir / "records.jsonl"):
        wanted = (r.quant, r.stage_users, r.experiment) == (quant, users, "sweep") and r.stage_id in complete
        if wanted and not r.warmup and r.ok and r.ttft_s is not None:
            per_stage.setdefault(r.stage_id or "", []).append(r.ttft_s)
    return float(np.percentile([x for v in per_stage.values() for x in v], q, method="linear"))


# ------------------------------------------------------------------------------------------- tests


def test_report_of_a_complete_run_matches_the_run_files(run_copy: Path) -> None:
    started = time.monotonic()
    paths = build_report(run_copy, None, ReportSettings())
    took_s = time.monotonic() - started
    assert took_s < 120, f"the report took {took_s:.0f} s"
    rows = table(paths)
    manifest = json.loads((run_copy / "manifest.json").read_text())
    quality_file = json.loads((run_copy / "quality.json").read_text())
    quality, kld = quality_file["results"], quality_file["kld"]["results"]
    speed = json.loads((run_copy / "speed.json").read_text())["results"]
    assert list(rows) == list(manifest["files"])
    for quant, row in rows.items():
        assert int(row["file_size_bytes"]) == manifest["files"][quant]["size_bytes"]
        assert float(row["perplexity"]) == pytest.approx(quality[quant]["perplexity"], rel=1e-5)
        assert float(row["perplexity_error"]) == pytest.approx(quality[quant]["perplexity_error"], rel=1e-5)
        weights = kld[quant]["f16"]  # the weights' own loss: the f16 KV cache
        assert float(row["kld_mean_nats"]) == pytest.approx(weights["kld_mean_nats"], rel=1e-5, abs=1e-12)
        assert float(row["kld_mean_error_nats"]) == pytest.approx(
            max(e for e in (weights["kld_mean_error_nats"], weights["kld_mean_chunk_error_nats"]) if e is not None),
            rel=1e-5, abs=1e-12,
        )  # fmt: skip
        assert float(row["same_top_p_pct"]) == pytest.approx(weights["same_top_p_pct"], rel=1e-5)
        assert float(row["decode_tok_s"]) == pytest.approx(
            speed[quant]["bench"]["decode"]["tokens_per_s"], rel=1e-5
        )
        assert float(row["prefill_tok_s"]) == pytest.approx(
            speed[quant]["bench"]["prefill"]["tokens_per_s"], rel=1e-5
        )
        for users in (1, 2):
            for q in (50, 99):
                expected = level_percentile(run_copy, quant, users, q)
                assert float(row[f"ttft_p{q}_s_at_{users}_users"]) == pytest.approx(expected, rel=1e-5)
            assert float(row[f"output_tok_s_at_{users}_users_max"]) >= float(
                row[f"output_tok_s_at_{users}_users_min"]
            )
    summary = summary_of(paths)
    kv = json.loads((run_copy / "kv.json").read_text())["results"]
    assert {r["quant"]: r["reported_mib"] for r in summary["kv"]} == {
        q: v["reported_mib"] for q, v in kv.items()
    }  # type: ignore[union-attr,index]
    header = summary["header"]
    assert isinstance(header, dict)
    assert header["llama_cpp"].startswith(manifest["llama_cpp"]["sdist"])
    assert header["model_note"] == manifest["source"]["note"]
    assert "one at a time" in header["servers"]
    markdown = paths.markdown.read_text()
    assert "random weights: quality figures are meaningless" in markdown
    assert "cache_prompt=false on every request" in markdown
    names = {p.name for p in paths.plots}
    assert {"ttft_vs_concurrency.png", "throughput_vs_concurrency.png", "latency_vs_throughput.png",
            "quality_speed_size.png", "kv_cache_types.png"} <= names  # fmt: skip
    trade = {(r["quant"], r["cache_type"]): r for r in summary["kv_cache_types"]}  # type: ignore[union-attr,index]
    for (quant, kind), row in trade.items():
        assert row["kld_mean_nats"] == pytest.approx(kld[quant][kind]["kld_mean_nats"], rel=1e-5, abs=1e-12)
    if has_prometheus_data(run_copy):
        assert "server_timeseries.png" in names
        assert gaps_besides_the_absent_gpu(summary["not_measured"]) == [], summary["not_measured"]  # type: ignore[arg-type]
        prometheus = summary["prometheus"]
        assert isinstance(prometheus, dict) and "on a copy of" in str(prometheus["origin"])
        assert prometheus["series_points"] > 0 and prometheus["histogram_check"]
        law = summary["littles_law"]
        assert isinstance(law, list) and law
        # A window spanning three 1 s scrape intervals must hold server samples; shorter ones may not.
        long_enough = [row for row in law if row["window_s"] >= 3.0]
        assert all(row["server_processing"] is not None for row in long_enough), long_enough


def stop_the_run_during_its_last_quant(run_dir: Path) -> str:
    """What a Ctrl-C in the middle of Q4_K_M's sweep leaves: run.json interrupted, a torn record,
    a stage without its end line, no prompt-cache stages and no kv.json."""
    state = json.loads((run_dir / "run.json").read_text())
    state.update(status="interrupted", finished_unix_s=None)
    state["steps"] = [
        s for s in state["steps"]
        if not (s["quant"] == "Q4_K_M" and s["name"] in ("load", "prefix_cache", "kv_types"))
    ]
    state["steps"].append({"name": "load", "quant": "Q4_K_M", "status": "running", "started_unix_s": time.time(),
                           "finished_unix_s": None, "error": None})  # fmt: skip
    (run_dir / "run.json").write_text(json.dumps(state))
    events = (run_dir / "stages.jsonl").read_text().splitlines()
    q4_events = [line for line in events if '"quant":"Q4_K_M"' in line]
    kept_events = [line for line in events if '"quant":"Q4_K_M"' not in line] + q4_events[:3]
    first, second = (json.loads(line)["stage_id"] for line in q4_events[1:3])  # 1 user ended, 2 started
    records = (run_dir / "records.jsonl").read_text().splitlines()
    q4 = [line for line in records if '"quant":"Q4_K_M"' in line and '"experiment":"sweep"' in line]
    whole = [line for line in q4 if json.loads(line)["stage_id"] == first]
    cut = [line for line in q4 if json.loads(line)["stage_id"] == second]
    kept = [line for line in records if '"quant":"Q4_K_M"' not in line] + whole + cut[:3]
    (run_dir / "records.jsonl").write_text("\n".join(kept) + "\n" + cut[3][:60])
    (run_dir / "stages.jsonl").write_text("\n".join(kept_events) + "\n")
    (run_dir / "kv.json").unlink()
    return "the load step for Q4_K_M was still running when the run stopped"


def lose_the_quality_step(run_dir: Path) -> str:
    state = json.loads((run_dir / "run.json").read_text())
    for step in state["steps"]:
        if step["name"] == "quality":
            step.update(status="failed", error="llama-perplexity was killed (signal 9)")
    (run_dir / "run.json").write_text(json.dumps(state))
    (run_dir / "quality.json").unlink()
    return "the quality step for F16 failed: llama-perplexity was killed (signal 9)"


def lose_prometheus(run_dir: Path) -> str:
    shutil.rmtree(run_dir / "prometheus", ignore_errors=True)
    return "the run folder holds no saved Prometheus data"


@pytest.mark.parametrize(
    "damage",
    [stop_the_run_during_its_last_quant, lose_the_quality_step, lose_prometheus],
    ids=lambda f: f.__name__,
)
def test_an_incomplete_run_still_reports_what_is_missing_and_why(run_copy: Path, damage: object) -> None:
    assert callable(damage)
    why = damage(run_copy)
    paths = build_report(run_copy, f"http://127.0.0.1:{free_port()}", ReportSettings())
    markdown = paths.markdown.read_text()
    assert "not measured: " in markdown and why in markdown, markdown[:3000]
    for path in paths.all():
        assert path.is_file()
    rows = table(paths)
    summary = summary_of(paths)
    if damage is lose_the_quality_step:
        assert all(row["perplexity"] == "" for row in rows.values())
        assert "quality_speed_size.png" not in {p.name for p in paths.plots}
    if damage is stop_the_run_during_its_last_quant:
        assert rows["Q4_K_M"]["ttft_p50_s_at_2_users"] == ""  # unfinished stage: no figure
        assert summary["header"]["status"] == "interrupted"  # type: ignore[index]
        assert "1 line of records.jsonl could not be read" in markdown
        assert "not measured: concurrency sweep of Q4_K_M at 2 users: repeat 0: unfinished" in markdown
    if damage is lose_prometheus:
        assert "server_timeseries.png" not in {p.name for p in paths.plots}
        assert prometheus_how() in markdown  # install advice only where it is not installed


def test_cli_reports_and_compares_real_runs(
    run_copy: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(run_copy), "--slo-ttft-p99", "0.5", "--slo-tpot", "0.05"]) == 0
    assert str(run_copy / "report.html") in capsys.readouterr().out
    other = tmp_path / "stopped"
    shutil.copytree(run_copy, other)
    lose_the_quality_step(other)
    out = tmp_path / "comparison"
    assert main(["report", "--compare", str(run_copy), str(other), "--out", str(out)]) == 0
    compared = (out / "compare.md").read_text()
    assert "perplexity" in compared and "not measured: quality (quality.json)" in compared


def test_html_report_renders_in_headless_chromium(run_copy: Path, tmp_path: Path) -> None:
    from PIL import Image

    browser = require_binary("chromium", "apt-get install -y chromium")
    paths = build_report(run_copy, None, ReportSettings())
    url = paths.html.resolve().as_uri()
    profile = tmp_path / "profile"
    profile.mkdir()
    shot = tmp_path / "report.png"
    base = [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}"]
    subprocess.run([*base, f"--screenshot={shot}", "--window-size=1400,3000", url],
                   capture_output=True, timeout=120, check=False)  # fmt: skip
    dom = subprocess.run(
        [*base, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=False
    ).stdout
    assert shot.is_file(), "chromium wrote no screenshot"
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape == (3000, 1400)
    assert pixels.std() > 20, "the page looks blank"
    assert (pixels < 200).mean() > 0.05, "almost nothing is drawn on the page"
    assert '<table id="quant-table" class="data">' in dom
    quant_table = dom.split('id="quant-table"', 1)[1].split("</table>", 1)[0]
    for quant in ("F16", "Q8_0", "Q4_K_M"):
        assert f'<td class="txt">{quant}</td>' in quant_table
    assert dom.count('<img alt="') == len(paths.plots) >= 4
    assert dom.count('src="data:image/png;base64,') == len(paths.plots)
    keep = os.environ.get("QL_REPORT_SCREENSHOT")
    if keep:
        shutil.copyfile(shot, keep)
