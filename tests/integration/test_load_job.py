"""The compose load job's command (`quantload load` at every server in turn) when one server is gone.

Found by the compose e2e: a llama-server container killed mid-load made the prompt-cache
experiment's /tokenize call raise, which ended the whole job, so the servers after it were never
measured. Now the dead server's remaining experiments are skipped, the job goes on, says which
server it lost, and exits 1.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from quantload.cli.main import main as cli_main
from quantload.llamacpp.server import free_port
from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.load.records import iter_stage_events

pytestmark = [pytest.mark.integration, pytest.mark.slow]


@pytest.fixture
def fake() -> Iterator[FakeServer]:
    with FakeServer(FakeScript(ttft_ms=(5, 20), itl_ms=(1, 3), tokens=4, close_after_stream=True)) as server:
        yield server


def test_the_load_job_goes_on_past_a_server_that_stopped_answering(
    fake: FakeServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    code = cli_main([
        "load", "--url", dead, "--name", "llama-q8-0", "--quant", "Q8_0",
        "--url", fake.url, "--name", "llama-q4-k-m", "--quant", "Q4_K_M",
        "--experiment", "sweep", "--experiment", "prefix_cache", "--out", str(tmp_path),
        "--users", "1", "--repeats", "1", "--prompt-count", "2", "--max-tokens", "4",
        "--metrics-port", "0", "--run-id", "job",
    ])  # fmt: skip
    assert code == 1
    err = capsys.readouterr().err
    assert "error: llama-q8-0 (Q8_0) prefix_cache: cannot reach" in err
    assert "remaining experiments were not run" in err
    ends = [e for e in iter_stage_events(tmp_path / "stages.jsonl") if e.event == "stage_end"]
    assert {e.status for e in ends if e.server == "llama-q8-0"} == {"failed"}
    measured = {(e.experiment, e.status) for e in ends if e.server == "llama-q4-k-m"}
    assert measured == {("sweep", "ok"), ("prefix_cache", "ok")}
    summary = json.loads((tmp_path / "load-summary.json").read_text())
    assert {s["server"] for s in summary} == {"llama-q8-0", "llama-q4-k-m"}
