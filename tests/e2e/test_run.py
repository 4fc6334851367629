"""`quantload run` end to end on the tiny model: real llama-server, Prometheus, Locust, report."""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from quantload.llamacpp.toolchain import Toolchain
from support import (
    CI_API_KEY,
    GRAFANA_ANNOTATIONS_JSON,
    clean_env,
    gaps_besides_the_absent_gpu,
    run_quantload,
)

pytestmark = pytest.mark.integration
QUANTS = ("F16", "Q8_0", "Q4_K_M")


def _json(path: Path) -> Any:
    return json.loads(path.read_text())


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and value == value


def test_run_finishes_with_every_step_ok(ci_run: Path) -> None:
    run = _json(ci_run / "run.json")
    assert run["status"] == "finished"
    steps = {(s["name"], s["quant"]): s for s in run["steps"]}
    for quant in ("F16", "Q8_0", "Q4_K_M"):
        for name in ("quality", "speed", "serve", "kv", "load", "prefix_cache", "sessions", "mixed", "limit_users",
                     "kv_types"):
            assert steps[(name, quant)]["status"] == "ok", steps[(name, quant)]
    assert steps[("report", None)]["status"] == "ok"
    assert run["prometheus"]["available"] is True
    assert all(server["status"] == "ok" for server in run["servers"].values())
    logs = {p.name for p in (ci_run / "logs").iterdir()}
    assert {"llama-server-F16.log", "llama-server-Q8_0.log", "llama-server-Q4_K_M.log", "prometheus.log"} <= logs
    assert any(name.startswith("locust-") for name in logs)
    for quant in ("F16", "Q8_0", "Q4_K_M"):  # every child's output is kept in the run
        for tool in ("llama-perplexity", "llama-bench"):
            text = (ci_run / "logs" / f"{tool}-{quant}.log").read_text(encoding="utf-8")
            assert text.startswith("$ ") and tool in text.splitlines()[0]
            assert "# quantload: the tool's output ended after" in text
    assert {"prepare-quantize-Q8_0.log", "prepare-quantize-Q4_K_M.log"} <= logs
    kv = _json(ci_run / "kv.json")
    assert kv["llama_cpp"]["binary_version"].startswith("version")
    assert all(result["server_build"] and result["diff_pct"] == 0.0 for result in kv["results"].values())
    # the kv_types experiment's q8_0 variants, each checked (the f16 one is the quantization's own):
    # each server, running alone, restarted in place with a q8_0 cache (and -fa on), then as it was
    assert {quant: sorted(per) for quant, per in kv["cache_types"].items()} == {q: ["q8_0"] for q in QUANTS}
    for quant, per in kv["cache_types"].items():
        assert per["q8_0"]["diff_pct"] == 0.0 and per["q8_0"]["flash_attn"] == "enabled", quant
        text = (ci_run / "logs" / f"llama-server-{quant}.log").read_text(encoding="utf-8")
        launches = [line for line in text.splitlines() if line.startswith("$ ")]
        variants = [line for line in launches if "-ctk q8_0 -ctv q8_0" in line]
        assert len(variants) == 1 and "-fa on" in variants[0], launches
        assert "-ctk f16 -ctv f16" in launches[-1]  # back as it was


def test_the_run_measures_kld_against_its_f16(ci_run: Path) -> None:
    run = _json(ci_run / "run.json")
    kld_steps = [step for step in run["steps"] if step["name"] == "kld"]
    assert len(kld_steps) == 1 + 3 * 2  # the base, then F16 (floor), Q8_0, Q4_K_M with f16 and q8_0 KV
    assert all(step["status"] == "ok" for step in kld_steps), kld_steps
    kld = _json(ci_run / "quality.json")["kld"]
    assert (kld["base"]["ctx_tokens"], kld["base"]["chunks_scored"]) == (128, 2)  # the ci profile's cap
    assert kld["base"]["source_note"].startswith("random weights")
    assert not Path(kld["base"]["file_path"]).exists()  # removed after use
    assert {quant: sorted(per_type) for quant, per_type in kld["results"].items()} == {
        quant: ["f16", "q8_0"] for quant in ("F16", "Q8_0", "Q4_K_M")
    }
    assert kld["results"]["F16"]["f16"]["is_floor"] is True
    assert (ci_run / "logs" / "llama-perplexity-kld-base.log").is_file()


def test_no_file_the_run_writes_holds_the_api_key(ci_run: Path) -> None:
    key = CI_API_KEY.encode()
    files = [path for path in ci_run.rglob("*") if path.is_file()]
    assert len(files) > 20 and any(p.name == "llama-server-F16.log" for p in files)
    assert [str(path.relative_to(ci_run)) for path in files if key in path.read_bytes()] == []
    assert "--api-key" not in (ci_run / "logs" / "llama-server-F16.log").read_text().splitlines()[0]


def test_the_run_annotates_every_load_stage_in_grafana(ci_run: Path) -> None:
    pushed = _json(ci_run.parent / GRAFANA_ANNOTATIONS_JSON)
    ends = [
        event for event in map(json.loads, (ci_run / "stages.jsonl").read_text().splitlines())
        if event["event"] == "stage_end" and event["status"] == "ok"
    ]
    assert len(pushed) == len(ends) > 0  # each stage once
    for body in pushed:
        assert body["tags"][:2] == ["quantload", "stage"] and body["timeEnd"] > body["time"]
    assert {body["tags"][2] for body in pushed} == {"F16", "Q8_0", "Q4_K_M"}
    assert {body["tags"][3] for body in pushed} == {
        "sweep", "prefix_cache", "sessions", "mixed", "limit_users", "kv_types"
    }


def test_every_report_section_has_numbers(ci_run: Path) -> None:
    summary = _json(ci_run / "summary.json")
    assert gaps_besides_the_absent_gpu(summary["not_measured"]) == []
    assert summary["quants"] == ["F16", "Q8_0", "Q4_K_M"]
    for row in summary["table"]:
        for key in ("file_size_bytes", "perplexity", "perplexity_error", "prefill_tok_s", "decode_tok_s",
                    "ttft_p50_s_at_1_users", "ttft_p99_s_at_2_users", "output_tok_s_at_2_users",
                    "kld_mean_nats", "kld_mean_error_nats", "same_top_p_pct"):
            assert _number(row[key]), (row["quant"], key, row[key])
    assert {(level["quant"], level["users"]) for level in summary["sweep_levels"]} == {
        (q, u) for q in ("F16", "Q8_0", "Q4_K_M") for u in (1, 2)
    }
    assert all(_number(c["output_tok_s"]) or c["max_users"] is None for c in summary["capacity"])
    assert all(c["sentence"] for c in summary["capacity"])
    for entry in summary["prompt_cache"]:
        assert _number(entry["off"]["ttft_p50_s"]) and _number(entry["on"]["ttft_p50_s"])
        assert entry["on"]["cache_n_mean"] > entry["off"]["cache_n_mean"] == 0
    assert all(entry["diff_pct"] == 0.0 for entry in summary["kv"])
    loss = summary["quality_loss"]
    assert len(loss["sentences"]) == 3 and "random weights" in loss["reference"]  # the floor, Q8_0, Q4_K_M
    assert loss["sentences"][1].startswith("Q8_0: mean KLD ") and "Q4_K_M" in loss["sentences"][1]
    assert summary["quality_verdict"]["sentence"] and summary["quality_verdict"]["max_kld_mean_nats"] == 0.05
    assert summary["quality_verdict"]["within_limit"] or summary["quality_verdict"]["over_limit"]
    trade = {(row["quant"], row["cache_type"]): row for row in summary["kv_cache_types"]}
    assert set(trade) == {(q, t) for q in QUANTS for t in ("f16", "q8_0")}
    for key, row in trade.items():
        for column in ("kv_predicted_mib", "kv_reported_mib", "output_tok_s", "tpot_p50_s", "kld_mean_nats"):
            assert _number(row[column]), (key, column, row[column])
        assert row["kv_reported_mib"] == pytest.approx(row["kv_predicted_mib"], abs=0.005)
        assert row["users"] == 4 and row["status"] == "ok"
        assert row["own_server"] == (key[1] == "f16")
    markdown = (ci_run / "report.md").read_text()
    for title in ("## Quality loss against F16 (KL divergence)", "## KV-cache type trade-off"):
        assert title in markdown
    assert summary["quality_verdict"]["sentence"] in markdown
    assert all(_number(entry["fraction_of_ceiling"]) for entry in summary["roofline"])
    assert all(_number(split["prefill_p50_s"]) for split in summary["ttft_split"])
    assert summary["littles_law"] and summary["prometheus"]["histogram_check"]
    # the traffic experiments: conversations by turn, mixed traffic at two batch sizes, the search
    turns = {(row["quant"], row["turn"]) for row in summary["session_turns"]}
    assert turns == {(q, t) for q in ("F16", "Q8_0", "Q4_K_M") for t in (0, 1)}
    assert all(_number(row["ttft_p50_s"]) and row["prompt_tokens_p50"] > 0 for row in summary["session_turns"])
    assert {(row["quant"], row["server_args"], row["phase"]) for row in summary["mixed"]} == {
        (q, args, phase) for q in ("F16", "Q8_0", "Q4_K_M") for args in ("-b 2048 -ub 512", "-b 64 -ub 64")
        for phase in ("alone", "mixed")
    }  # fmt: skip
    assert all(_number(row["itl_p99_s"]) for row in summary["mixed"])
    assert summary["mixed_verdict"].startswith("F16: ")
    assert [line["quant"] for line in summary["limits"]] == ["F16", "Q8_0", "Q4_K_M"]
    for line in summary["limits"]:
        assert line["trials"] and line["seconds"] > 0 and line["ending"] in ("found", "capped", "max_level", "never_met")
    # the search's own words (a limit found, or the levels it left undecided with its trials), then the sweep's
    assert all(("search" in c["sentence"] or " trials in " in c["sentence"]) and c["sweep_sentence"]
               for c in summary["capacity"])  # fmt: skip
    report = (ci_run / "report.md").read_text()
    for title in ("## Finding the limit", "## Multi-turn sessions", "## Mixed traffic", "## Asked and delivered"):
        assert title in report
    with (ci_run / "table.csv").open() as handle:
        assert [row["quant"] for row in csv.DictReader(handle)] == ["F16", "Q8_0", "Q4_K_M"]
    for plot in summary["files"]["plots"]:
        assert (ci_run / plot).stat().st_size > 10_000
    html = (ci_run / "report.html").read_text()
    assert "data:image/png;base64," in html and "<table" in html


def test_the_run_predicts_each_file_before_its_load_or_says_why(ci_run: Path) -> None:
    run = _json(ci_run / "run.json")
    names = [step["name"] for step in run["steps"]]
    predicted = [step for step in run["steps"] if step["name"] == "predict"]
    assert predicted and names.index("predict") > max(i for i, name in enumerate(names) if name == "speed")
    assert names.index("predict") < names.index("serve")
    summary = _json(ci_run / "summary.json")
    checks = {check["quant"]: check for check in summary["prediction"]}
    assert list(checks) == list(QUANTS)
    report = (ci_run / "report.md").read_text()
    assert "## Predicted before the load, and measured" in report
    for step in predicted:
        if step["status"] != "ok":  # the ci profile predicts; where it could not, the report says why
            assert step["error"] and all(check["not_predicted"] for check in checks.values()), step
            continue
        quant = step["quant"]
        assert (ci_run / f"costs-{quant}.json").is_file()
        assert quant in _json(ci_run / "predict.json")["predictions"]
        check = checks[quant]
        assert check["sentence"].startswith("Predicted before the load: ") and "measured: " in check["sentence"]
        assert {level["users"] for level in check["levels"]} <= {1, 2} and check["parting"]


def test_report_can_be_rebuilt_from_the_run_directory_alone(ci_run: Path, tmp_path: Path) -> None:
    copy = tmp_path / ci_run.name
    shutil.copytree(ci_run, copy)
    (copy / "report.html").unlink()
    result = run_quantload(["report", str(copy)], cwd=tmp_path, timeout_s=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (copy / "report.html").stat().st_size > 50_000


def _start_tiny_run(tmp_path: Path) -> subprocess.Popen[str]:
    """`quantload run --model tiny --profile ci` (Q8_0 and Q4_K_M, 3 repeats) in its own session."""
    env = clean_env()
    env["QUANTLOAD_MODEL__QUANTS"] = '["Q8_0", "Q4_K_M"]'
    env["QUANTLOAD_LOAD__REPEATS"] = "3"
    env["QUANTLOAD_SERVER__API_KEY"] = CI_API_KEY
    command = [sys.executable, "-m", "quantload.cli.main", "run", "--model", "tiny", "--profile", "ci",
               "--out", str(tmp_path)]
    return subprocess.Popen(command, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True, preexec_fn=_ctrl_c_as_at_a_terminal)


def _ctrl_c_as_at_a_terminal() -> None:
    """SIGINT back to its default in the child: a test suite started in the background (`make test &`,
    nohup, CI) inherits SIGINT ignored, and a Python started so keeps ignoring it, as it should."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _wait_for_load_with_records(process: subprocess.Popen[str], tmp_path: Path, quant: str) -> dict[str, Any] | None:
    """run.json once `quant`'s load step runs and records exist; None if the run ended first."""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and process.poll() is None:
        time.sleep(0.2)
        runs = [p for p in tmp_path.iterdir() if (p / "run.json").is_file()]
        if not runs:
            continue
        try:
            run: dict[str, Any] = _json(runs[0] / "run.json")
        except ValueError:
            continue
        loading = [s for s in run["steps"] if s["name"] == "load" and s["quant"] == quant and s["status"] == "running"]
        records = runs[0] / "records.jsonl"
        if loading and records.is_file() and records.stat().st_size > 0:
            return run
    return None


def test_a_server_killed_mid_run_fails_its_stages_and_the_run_goes_on(
    toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    process = _start_tiny_run(tmp_path)
    killed_pid = None
    try:
        run = _wait_for_load_with_records(process, tmp_path, "Q8_0")
        if run is not None:
            killed_pid = run["servers"]["Q8_0"]["pid"]
            os.kill(killed_pid, signal.SIGKILL)
        _, stderr = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert killed_pid is not None, "the Q8_0 load step was never seen running"
    assert process.returncode == 0, stderr[-2000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    run = _json(run_dir / "run.json")
    assert run["status"] == "finished"
    assert run["servers"]["Q8_0"]["status"] == "died"
    assert run["servers"]["Q4_K_M"]["status"] == "ok"
    steps = {(s["name"], s["quant"]): s for s in run["steps"]}
    assert steps[("load", "Q8_0")]["status"] == "failed"
    assert steps[("prefix_cache", "Q8_0")]["status"] == "failed"
    assert steps[("prefix_cache", "Q8_0")]["error"] == "llama-server died earlier in the run"
    assert steps[("kv_types", "Q8_0")]["error"] == "llama-server died earlier in the run"
    assert steps[("load", "Q4_K_M")]["status"] == "ok"
    summary = _json(run_dir / "summary.json")
    q4 = next(row for row in summary["table"] if row["quant"] == "Q4_K_M")
    assert _number(q4["ttft_p50_s_at_1_users"])
    report = (run_dir / "report.md").read_text()
    assert "Q8_0" in report and "died" in report


def _processes_mentioning(text: str) -> list[str]:
    """Command lines of live processes (other than this one) whose arguments contain `text`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().split(b"\0")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        joined = " ".join(part.decode(errors="replace") for part in argv)
        if text in joined and state != "Z":
            found.append(f"{proc.name}: {joined[:200]}")
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="looks for leftover processes in /proc")
@pytest.mark.parametrize(
    ("stop_signal", "exit_code"),
    [pytest.param(signal.SIGINT, 130, marks=pytest.mark.long), (signal.SIGTERM, 143)],  # one path in make test
)
def test_ctrl_c_or_sigterm_stops_every_child_and_the_report_still_builds(
    toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path, stop_signal: int, exit_code: int
) -> None:
    # The signal goes to quantload alone (not its process group), so quantload must stop its children
    process = _start_tiny_run(tmp_path)
    interrupted = False
    seen_with_key: list[str] = []
    try:
        if _wait_for_load_with_records(process, tmp_path, "Q8_0") is not None:
            seen_with_key = _processes_mentioning(CI_API_KEY)  # no command line shows the key
            process.send_signal(stop_signal)
            interrupted = True
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert interrupted, "no load step was seen running"
    assert seen_with_key == []
    assert process.returncode == exit_code, stderr[-2000:]
    (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert _processes_mentioning(str(run_dir)) == []
    run = _json(run_dir / "run.json")
    assert run["status"] == "interrupted"
    assert run["finished_unix_s"] is not None
    assert all(step["status"] != "running" for step in run["steps"])
    measured = [line for line in (run_dir / "records.jsonl").read_text().splitlines() if line.strip()]
    assert measured, "what was measured before Ctrl-C is kept"

    result = run_quantload(["report", str(run_dir)], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    report = (run_dir / "report.md").read_text()
    assert "interrupted" in report


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
@pytest.mark.long
def test_sigkill_to_quantload_takes_its_children_along(
    toolchain: Toolchain, tiny_models: dict[str, Path], tmp_path: Path
) -> None:
    process = _start_tiny_run(tmp_path)
    killed = False
    try:
        run = _wait_for_load_with_records(process, tmp_path, "Q8_0")
        if run is not None:
            (run_dir,) = [p for p in tmp_path.iterdir() if p.is_dir()]
            assert _processes_mentioning(str(run_dir)), "llama-server and Locust should be running now"
            process.send_signal(signal.SIGKILL)  # no clean-up code of quantload's runs
            process.wait(timeout=10)
            killed = True
            deadline = time.monotonic() + 15
            while _processes_mentioning(str(run_dir)) and time.monotonic() < deadline:
                time.sleep(0.2)
            assert _processes_mentioning(str(run_dir)) == []
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert killed, "no load step was seen running"
