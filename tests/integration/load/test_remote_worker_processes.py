"""`quantload load-worker`'s loop with stand-in worker processes: one worker process per plan, again
after each, bounded when they fail, and a new one after a master went silent.

Moved from tests/unit/load/test_remote_worker.py, whose other tests start no process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from quantload.load.plan import API_KEY_ENV
from quantload.load.processes import FAILURE_MARKER, MASTER_LOST_EXIT
from quantload.load.remote_worker import FAILED_STARTS_LIMIT, WorkerLoop
from quantload.load.supervisor import LoadError

pytestmark = pytest.mark.integration


def _stand_in(code: str) -> list[str]:
    return [sys.executable, "-c", code]


def _counting_stand_in(counter: Path, exit_code: str) -> list[str]:
    """A worker that counts its starts in `counter` and exits with `exit_code` (of n, the starts before it)."""
    return _stand_in(
        f"import pathlib, sys; p = pathlib.Path({str(counter)!r}); n = int(p.read_text() or 0) if p.exists() else 0;"
        f" p.write_text(str(n + 1)); sys.exit({exit_code})"
    )


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
