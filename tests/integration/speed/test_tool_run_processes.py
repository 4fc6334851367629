"""Running a tool (a child Python stands in): both streams captured and streamed, time limits
enforced on its own process, its exit status kept, a binary that cannot start named, and its
logged output whole.

Moved from tests/unit/speed/test_tool_run.py, whose other tests start no process.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from quantload.errors import ToolchainError
from quantload.llamacpp.tool_run import logged_output, run_tool

pytestmark = pytest.mark.integration

PY = sys.executable


def test_both_streams_are_captured_and_streamed() -> None:
    seen: list[tuple[str, str]] = []
    script = (
        "import sys\n"
        "for i in range(3):\n"
        "    sys.stdout.write(f'[{i + 1}]1.5,'); sys.stdout.flush()\n"
        "    sys.stderr.write(f'line {i}\\n'); sys.stderr.flush()\n"
        "sys.stdout.write('é')\n"
    )
    run = run_tool([PY, "-c", script], on_output=lambda name, text: seen.append((name, text)))
    assert run.returncode == 0 and not run.timed_out and run.signal_name is None
    assert run.stdout == "[1]1.5,[2]1.5,[3]1.5,é"
    assert run.stderr == "line 0\nline 1\nline 2\n"
    assert "".join(text for name, text in seen if name == "stdout") == run.stdout
    assert run.stderr_tail(2) == "line 1 | line 2"


def test_a_run_past_its_limit_is_killed() -> None:
    script = "import time; print('started', flush=True); time.sleep(60)"
    run = run_tool([PY, "-c", script], timeout_s=5.0)  # room for Python to start on a busy machine
    assert run.timed_out
    assert run.signal_name in ("SIGTERM", "SIGKILL")  # its group signalled, then killed without grace
    assert run.stdout == "started\n"
    assert run.wall_time_s < 30


def test_a_process_that_closes_its_output_but_keeps_running_is_killed_at_the_limit() -> None:
    script = "import os, time; os.close(1); os.close(2); time.sleep(60)"
    run = run_tool([PY, "-c", script], timeout_s=1.0)
    assert run.timed_out and run.signal_name in ("SIGTERM", "SIGKILL")


def test_exit_status_is_kept() -> None:
    run = run_tool([PY, "-c", "import sys; sys.exit(3)"])
    assert run.returncode == 3 and run.signal_name is None
    assert run.stderr_tail() == "no output on stderr"


def test_a_binary_that_cannot_start_is_a_toolchain_error(tmp_path: Path) -> None:
    with pytest.raises(ToolchainError, match="cannot run"):
        run_tool([str(tmp_path / "llama-nothing")])


def test_logged_output_keeps_everything_the_tool_printed(tmp_path: Path) -> None:
    log_path = tmp_path / "logs" / "tool.log"
    seen: list[str] = []
    script = "import sys; print('to stdout'); print('to stderr', file=sys.stderr); sys.exit(3)"
    command = [PY, "-c", script]
    with logged_output(log_path, command, lambda name, text: seen.append(text)) as on_output:
        run = run_tool(command, on_output=on_output)
    assert run.returncode == 3
    lines = log_path.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "$ " + " ".join(command)
    assert {"to stdout", "to stderr"} <= set(lines)
    assert lines[-1].startswith("# quantload: the tool's output ended after")
    assert "".join(seen) in {"to stdout\nto stderr\n", "to stderr\nto stdout\n"}
