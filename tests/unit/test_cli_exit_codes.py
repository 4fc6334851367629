"""The `quantload` entry point passes every command's exit code on to the shell."""

from __future__ import annotations

import os
import signal
import time

import pytest
import typer

from quantload.cli import main as cli_main
from quantload.errors import ModelError


def _app_whose_command(action: str) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    def go() -> None:
        if action == "exit 3":
            raise typer.Exit(3)
        if action == "ctrl-c":
            raise KeyboardInterrupt
        if action == "user error":
            raise ModelError("model.gguf is not a GGUF file", "pass a .gguf file")
        if action in ("sigterm", "sighup"):
            os.kill(os.getpid(), signal.SIGTERM if action == "sigterm" else signal.SIGHUP)
            time.sleep(10)  # interrupted at once by the handler
            raise AssertionError("the signal did not interrupt the command")

    @app.command()
    def other() -> None:
        return None

    return app


@pytest.mark.parametrize(
    ("action", "exit_code", "stderr_part"),
    [("exit 3", 3, ""), ("ctrl-c", 130, "interrupted"), ("user error", 2, "not a GGUF file"), ("ok", 0, ""),
     ("sigterm", 143, "interrupted"), ("sighup", 129, "interrupted")],
)
def test_exit_codes_reach_the_shell(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], action: str, exit_code: int, stderr_part: str
) -> None:
    monkeypatch.setattr(cli_main, "build_app", lambda: _app_whose_command(action))
    assert cli_main.main(["go"]) == exit_code
    assert stderr_part in capsys.readouterr().err


def test_the_real_cli_says_its_version() -> None:
    assert cli_main.main(["--version"]) == 0


def test_the_signal_handlers_are_restored_after_the_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli_main, "build_app", lambda: _app_whose_command("ok"))
    before = signal.getsignal(signal.SIGTERM)
    assert cli_main.main(["go"]) == 0
    assert signal.getsignal(signal.SIGTERM) is before
