"""`quantload load-worker`: one worker process per plan, again after each, bounded when they fail."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from quantload.cli.cmd_load import remote_worker_lines
from quantload.cli.main import main as cli_main
from quantload.config import LoadSettings
from quantload.load.plan import API_KEY_ENV
from quantload.load.processes import ENTRY_MODULE, FAILURE_MARKER, MASTER_LOST_EXIT, workers_absent
from quantload.load.remote_worker import FAILED_STARTS_LIMIT, WorkerLoop, worker_argv
from quantload.load.summary import StageSummary
from quantload.load.supervisor import LoadError


def _stand_in(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _counting_stand_in(counter: Path, exit_code: str) -> list[str]:
    """A worker that counts its starts in `counter` and exits with `exit_code` (of n, the starts before it)."""
    return _stand_in(
        f"import pathlib, sys; p = pathlib.Path({str(counter)!r}); n = int(p.read_text() or 0) if p.exists() else 0;"
        f" p.write_text(str(n + 1)); sys.exit({exit_code})"
    )


def test_the_worker_command_joins_the_master_and_serves_its_metrics() -> None:
    argv = worker_argv("10.0.0.5", 5557, "10.0.0.7", 9647, python="py")
    assert argv[:3] == ["py", "-m", ENTRY_MODULE]
    pairs = dict(zip(argv[3::2], argv[4::2], strict=True))
    assert pairs == {
        "--role": "worker", "--master-host": "10.0.0.5", "--master-port": "5557",
        "--metrics-host": "10.0.0.7", "--metrics-port": "9647",
    }  # fmt: skip


def test_a_new_worker_starts_after_each_plan_with_the_key_in_its_environment(tmp_path: Path) -> None:
    seen = tmp_path / "seen"
    code = f"import os; open({str(seen)!r}, 'a').write(os.environ.get({API_KEY_ENV!r}, '-') + '\\n')"
    events: list[str] = []
    ended = WorkerLoop(_stand_in(code), tmp_path / "w.log", api_key="sk-k", plans=3, on_event=events.append).run()
    assert [e.returncode for e in ended] == [0, 0, 0] and [e.number for e in ended] == [1, 2, 3]
    assert seen.read_text().split() == ["sk-k"] * 3
    assert sum("ended its plan" in line for line in events) == 3
    assert (tmp_path / "w.log").read_text().count("--- worker ") == 3


def test_workers_that_keep_failing_at_once_end_the_loop_with_their_cause(tmp_path: Path) -> None:
    code = f"import sys; sys.stderr.write({FAILURE_MARKER + 'no master here'!r} + '\\n'); sys.exit(1)"
    events: list[str] = []
    with pytest.raises(LoadError, match="failed 3 times in a row: no master here") as failed:
        WorkerLoop(_stand_in(code), tmp_path / "w.log", on_event=events.append).run()
    assert FAILED_STARTS_LIMIT == 3 and str(tmp_path / "w.log") in failed.value.hint
    assert sum("failed after" in line for line in events) == 3


def test_a_plan_that_ends_well_resets_the_count_of_failures(tmp_path: Path) -> None:
    # fails, fails, succeeds, fails, fails, succeeds: never three failures in a row
    stand_in = _counting_stand_in(tmp_path / "n", "0 if n % 3 == 2 else 1")
    ended = WorkerLoop(stand_in, tmp_path / "w.log", plans=2).run()
    assert [e.returncode for e in ended] == [1, 1, 0, 1, 1, 0]


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


def test_a_worker_whose_master_went_silent_is_followed_by_a_new_one_without_counting_a_plan(
    tmp_path: Path,
) -> None:
    # the first worker lost its master, the second served a plan
    stand_in = _counting_stand_in(tmp_path / "n", f"{MASTER_LOST_EXIT} if n == 0 else 0")
    events: list[str] = []
    ended = WorkerLoop(stand_in, tmp_path / "w.log", plans=1, on_event=events.append).run()
    assert [e.returncode for e in ended] == [MASTER_LOST_EXIT, 0]
    assert sum("lost its master" in line for line in events) == 1
    assert sum("ended its plan" in line for line in events) == 1
