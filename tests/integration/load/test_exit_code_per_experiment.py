"""`quantload load` exits 1 when an experiment measured nothing, whatever the experiment: against a
server that answers 503 to every request, and against a port nobody listens on (docs/faults.md)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from quantload.cli.main import main
from quantload.load.fakeserver import FakeScript, FakeServerProcess

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMALL = """
[load]
users = [1]
repeats = 1
prompt_count = 2
max_tokens = 4
warmup_requests = 0
metrics_port = 0
max_consecutive_errors = 2
rates_rps = [4.0]
open_loop_requests = 3
prefix_tokens = 40
prefix_requests = 2
request_timeout_s = 10
first_round_jitter_s = 0.0
[sessions]
count = 1
turns = 1
think_time_s = 0.0
[mixed]
decode_requests = 2
batch_sizes = ["2048/512"]
[slo]
level_max_s = 2
[limit]
max_users = 2
requests_per_user = 1
min_requests = 2
time_cap_s = 60
trial_seconds = 1
max_rate_rps = 4
[trace]
path = "{trace}"
[soak]
duration_s = 2
slice_s = 1
"""
EXPERIMENTS = (
    "sweep", "open_loop", "prefix_cache", "sessions", "trace", "mixed", "limit_users", "limit_rate", "soak"
)  # fmt: skip


@pytest.fixture
def config(tmp_path: Path) -> Path:
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(f'{{"arrival_s": {i * 0.1}, "input_tokens": 20, "output_tokens": 4}}\n' for i in range(3)))
    path = tmp_path / "quantload.toml"
    path.write_text(SMALL.format(trace=trace))
    return path


@pytest.fixture(scope="module")
def refusing() -> Iterator[str]:
    """A server that answers every completion with HTTP 503 (its /tokenize and /props still work)."""
    with FakeServerProcess(FakeScript(fault_every=1, fault="http_503", tokens=4)) as fake:
        yield fake.url


@pytest.mark.parametrize("experiment", EXPERIMENTS)
def test_an_experiment_against_a_server_answering_503_to_everything_exits_1(
    experiment: str, refusing: str, config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--config", str(config), "load", "--url", refusing, "--out", str(tmp_path / "out"), "-e", experiment])
    err = capsys.readouterr().err
    assert code == 1, err[-2000:]
    assert "Traceback" not in err


@pytest.mark.parametrize("experiment", ["sweep", "limit_users", "limit_rate"])
def test_an_experiment_against_a_closed_port_exits_1(
    experiment: str, config: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        port = holder.getsockname()[1]  # bound, never listening: connections are refused
        code = main(
            ["--config", str(config), "load", "--url", f"http://127.0.0.1:{port}", "--out", str(tmp_path / "out"),
             "-e", experiment]
        )  # fmt: skip
    err = capsys.readouterr().err
    assert code == 1, err[-2000:]
    assert "Traceback" not in err
