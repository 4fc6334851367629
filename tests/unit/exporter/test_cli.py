"""`quantload exporter` from the command line."""

from __future__ import annotations

import pytest

from quantload.cli.main import main


def test_without_targets_it_says_how_to_give_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exporter"]) == 2
    assert "--target NAME=URL" in capsys.readouterr().err


def test_a_bad_target_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exporter", "--target", "x=ftp://nowhere"]) == 2
    err = capsys.readouterr().err
    assert "not an http(s) URL" in err and "Traceback" not in err
