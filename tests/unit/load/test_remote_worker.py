"""`quantload load-worker`: its command, its command line's refusals, and how the console tells
remote workers apart.

Its loop with stand-in worker processes: tests/integration/load/test_remote_worker_processes.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from quantload.cli.load_console import remote_worker_lines
from quantload.cli.main import main as cli_main
from quantload.config import LoadSettings
from quantload.load.processes import ENTRY_MODULE, workers_absent
from quantload.load.remote_worker import worker_argv
from quantload.load.summary import StageSummary


def test_the_worker_command_joins_the_master_and_serves_its_metrics() -> None:
    argv = worker_argv("10.0.0.5", 5557, "10.0.0.7", 9647, python="py")
    assert argv[:3] == ["py", "-m", ENTRY_MODULE]
    pairs = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert pairs == {
        "--role": "worker", "--master-host": "10.0.0.5", "--master-port": "5557",
        "--metrics-host": "10.0.0.7", "--metrics-port": "9647",
    }  # fmt: skip


def test_cli_refuses_an_empty_master_host_and_a_folder_as_log(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli_main(["load-worker", "--master-host", " "]) == 2
    assert "--master-host is empty" in capsys.readouterr().err
    assert cli_main(["load-worker", "--master-host", "10.0.0.5", "--log", str(tmp_path)]) == 2
    assert "is a folder" in capsys.readouterr().err
    assert cli_main(["load-worker", "--master-host", "10.0.0.5", "--master-port", "0"]) == 2


def _summary(reason: str | None) -> StageSummary:
    """A stage that ran (no reason) or was aborted with `reason`; the other figures do not matter."""
    return StageSummary.model_construct(
        run_id="r", server="s", quant="q", experiment="sweep", stage_id="x", stage_index=0,
        status="aborted" if reason else "ok", reason=reason,
    )  # fmt: skip


def test_an_experiment_whose_workers_never_joined_is_told_apart() -> None:
    missing = "only 0 of 2 workers connected within 60 s (load.workers_timeout_s)"
    assert workers_absent([_summary(missing), _summary(missing)]) == missing
    assert workers_absent([_summary(missing), _summary(None)]) is None  # one stage ran: they were there
    assert workers_absent([]) is None


def test_the_console_says_where_remote_workers_must_join() -> None:
    assert remote_worker_lines(LoadSettings()) == []
    (line,) = remote_worker_lines(LoadSettings(remote_workers=2, master_host="10.0.0.5"))
    assert "10.0.0.5:5557" in line and "quantload load-worker" in line
    lines = remote_worker_lines(LoadSettings(remote_workers=1))
    assert len(lines) == 2 and "other hosts cannot reach" in lines[1]
