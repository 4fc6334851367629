"""An unusable output path is one line naming it, before any work, for every command that writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from quantload.cli.main import main


@pytest.fixture
def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "plain.txt"
    path.write_text("not a folder\n")
    return path


def _one_line_error(capsys: pytest.CaptureFixture[str], needle: str) -> None:
    err = capsys.readouterr().err
    assert "Traceback" not in err and needle in err
    assert len([line for line in err.splitlines() if line.strip()]) == 1, err


@pytest.mark.parametrize(
    "args",
    [
        ["load", "--url", "http://127.0.0.1:9", "--out", "{file}"],
        ["prepare", "--model", "tiny", "--out", "{file}"],
        ["run", "--model", "tiny", "--out", "{file}"],
        ["report", "{tmp}", "--out", "{file}"],
        ["load", "--url", "http://127.0.0.1:9", "--out", "{file}/below"],
    ],
)
def test_a_file_given_as_a_folder_is_refused(
    args: list[str], a_file: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [a.format(file=a_file, tmp=tmp_path) for a in args]
    assert main(argv) == 2
    _one_line_error(capsys, str(a_file))


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_folder_that_cannot_be_written_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    assert main(["load", "--url", "http://127.0.0.1:9", "--out", str(locked / "out")]) == 2
    _one_line_error(capsys, "not writable")


@pytest.mark.parametrize("command", ["quality", "speed"])
def test_a_result_file_that_is_not_one_is_refused_before_measuring(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model = tmp_path / "missing.gguf"  # never reached: the output is checked first
    garbage = tmp_path / f"{command}.json"
    garbage.write_text('{"some": "other file"}\n')
    assert main([command, str(model), "--out", str(garbage)]) == 2
    _one_line_error(capsys, f"is not a quantload.{command}")
    assert main([command, str(model), "--out", str(tmp_path)]) == 2
    _one_line_error(capsys, "is a folder")


def test_zero_users_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["load", "--url", "http://127.0.0.1:9", "--out", str(tmp_path), "--users", "0"]) == 2
    _one_line_error(capsys, "load.users")
