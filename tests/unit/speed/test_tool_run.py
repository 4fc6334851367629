"""A tool's logged output: an interruption noted and passed on, no file without a log path.

Running a tool (a child process): tests/integration/speed/test_tool_run_processes.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from quantload.llamacpp.tool_run import logged_output


def test_logged_output_notes_an_interruption_and_passes_it_on(tmp_path: Path) -> None:
    log_path = tmp_path / "tool.log"
    with pytest.raises(KeyboardInterrupt), logged_output(log_path, ["tool"], lambda n, t: None) as on_output:
        on_output("stderr", "half a line")
        raise KeyboardInterrupt
    text = log_path.read_text(encoding="utf-8")
    assert "half a line" in text and "# quantload: stopped by KeyboardInterrupt after" in text


def test_no_log_path_means_no_file(tmp_path: Path) -> None:
    def callback(name: str, text: str) -> None:
        return None

    with logged_output(None, ["tool"], callback) as on_output:
        assert on_output is callback
    assert list(tmp_path.iterdir()) == []
