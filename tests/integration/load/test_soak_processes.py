"""The whole soak experiment against the fake server in a process of its own (real Locust
processes), with its server's memory read from /proc and its report section, figure and
summary.json entry.

Moved from tests/unit/load/test_soak.py, whose other tests start no process.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from load_api import context
from quantload.config import LoadSettings
from quantload.experiments.base import ExperimentContext, ServedVariant, ServerFlags
from quantload.experiments.soak.stages import run as run_soak
from quantload.experiments.soak.watch import read_soak_lines
from quantload.load.fakeserver import FakeScript, FakeServerProcess
from quantload.served import ServedTarget
from quantload.stack.run_steps import RunSteps

pytestmark = pytest.mark.integration

TARGET = ServedTarget(name="llama-q4_k_m", quant="Q4_K_M", model="m", url="http://127.0.0.1:1")


# ----------------------------------------------------------------------------- the whole experiment


class FakeServers:
    """The fake server as the run's server control: its process is the served llama-server."""

    def __init__(self, fake: FakeServerProcess) -> None:
        self.fake = fake

    def server_pid(self) -> int | None:
        return self.fake.pid

    @contextlib.contextmanager
    def variant(self, flags: ServerFlags) -> Iterator[ServedVariant]:
        raise AssertionError("the soak never restarts its server")
        yield  # pragma: no cover


@pytest.mark.slow
def test_a_soak_streams_its_slices_and_readings_and_the_report_draws_them(tmp_path: Path) -> None:
    script = FakeScript(ttft_ms=(2, 5), itl_ms=(1, 2), tokens=6, close_after_stream=True)
    load = LoadSettings(warmup_requests=1, request_timeout_s=10, first_round_jitter_s=0.01, metrics_port=0,
                        prompt_count=8, max_tokens=6)  # fmt: skip
    run = context(tmp_path, load, soak={"duration_s": 8, "slice_s": 2, "users": 3, "sample_s": 0.5})
    with FakeServerProcess(script) as fake:
        target = TARGET.model_copy(update={"url": fake.url})
        done = run_soak(ExperimentContext(run, target, FakeServers(fake)))
    assert [s.phase for s in done.summaries] == [f"slice {i}/4" for i in range(1, 5)]
    assert all(s.status == "ok" and s.requests == s.requests_planned == s.ok > 8 for s in done.summaries)
    assert all(s.client_rss_bytes and s.client_rss_bytes > 10 * 2**20 for s in done.summaries)
    lines = read_soak_lines(tmp_path / "soak.jsonl")
    assert [lines[0].event, lines[-1].event] == ["soak_start", "soak_end"]
    assert (lines[0].users, lines[0].slices, lines[0].memory_source) == (3, 4, "proc")
    samples = [line for line in lines if line.event == "sample"]
    assert len(samples) >= 8 and all(s.server_rss_bytes and s.server_rss_bytes > 2**20 for s in samples)
    assert all(s.kv_cells_total == 4 * 4096 and s.kv_cells_used == 0 for s in samples)  # the fake's /slots
    paths = RunSteps(run.settings, {}, tmp_path).report(tmp_path, None)  # as `quantload run` writes it
    text = paths.markdown.read_text(encoding="utf-8")
    assert "## Soak" in text and "3 users held for" in text and "plots/soak.png" in text
    assert (tmp_path / "plots" / "soak.png").is_file()
    summary = json.loads((tmp_path / "summary.json").read_text())
    (entry,) = summary["soak"]
    series = ["TTFT p99", "server memory", "load client memory"]
    assert [(d["what"], d["part"]) for d in entry["drift"]] == [(w, "all") for w in series] + [
        (w, "second half") for w in series
    ]
    assert [d["points"] for d in entry["drift"]] == [3, 3, 3, 2, 2, 2] and len(entry["slices"]) == 4
    assert entry["memory_source"] == "proc" and entry["slices"][0]["server_rss_bytes"] > 2**20


@pytest.mark.slow
def test_a_soak_of_a_server_quantload_did_not_start_says_its_memory_was_not_measured(tmp_path: Path) -> None:
    script = FakeScript(ttft_ms=(2, 5), itl_ms=(1, 2), tokens=4, close_after_stream=True)
    load = LoadSettings(warmup_requests=0, request_timeout_s=10, metrics_port=0, prompt_count=4, max_tokens=4)
    run = context(tmp_path, load, soak={"duration_s": 2, "slice_s": 1, "users": 2, "sample_s": 0.5,
                                        "from_limit": True})  # fmt: skip
    warned: list[str] = []
    run = type(run)(**{**run.__dict__, "warn": warned.append})
    with FakeServerProcess(script) as fake:
        done = run_soak(ExperimentContext(run, TARGET.model_copy(update={"url": fake.url}), None))
    assert len(done.summaries) == 2 and all(s.users == 2 for s in done.summaries)
    assert any("no limit_users search" in line for line in warned)
    assert any("server memory not measured" in line for line in warned)
    RunSteps(run.settings, {}, tmp_path).report(tmp_path, None)
    summary = json.loads((tmp_path / "summary.json").read_text())
    gaps = [g["what"] for g in summary["not_measured"] if g["section"] == "soak"]
    assert "server memory during the soak of Q4_K_M" in gaps
    assert "drift of TTFT p99 during the soak of Q4_K_M" in gaps  # 2 slices, the first settling
