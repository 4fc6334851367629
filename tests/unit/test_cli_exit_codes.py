"""The `quantload` entry point passes every command's exit code on to the shell."""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
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


def _app_with_a_group() -> typer.Typer:
    """An app whose commands are subcommands (a callback makes it a group), as quantload's are."""
    app = typer.Typer()

    @app.callback()
    def group() -> None:
        pass

    return app


def _main_as_at_a_terminal(monkeypatch: pytest.MonkeyPatch, app: typer.Typer, argv: list[str]) -> int:
    """`cli_main.main(argv)` running `app`, with SIGINT raising KeyboardInterrupt as at a terminal
    (a test suite started in the background inherits SIGINT ignored)."""
    monkeypatch.setattr(cli_main, "build_app", lambda: app)
    previous_sigint = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return cli_main.main(argv)
    finally:
        signal.signal(signal.SIGINT, previous_sigint)


class _SignalledFinalizer:
    """An object whose finalizer is running when a stop signal arrives: the signal's
    KeyboardInterrupt is raised inside `__del__`, where Python prints it and drops it."""

    def __init__(self, signum: int) -> None:
        self.signum = signum

    def __del__(self) -> None:
        os.kill(os.getpid(), self.signum)
        time.sleep(0.5)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_an_interrupt_swallowed_by_a_finalizer_still_stops_the_command(
    monkeypatch: pytest.MonkeyPatch, signum: int, code: int
) -> None:
    ran_on: list[str] = []
    app = _app_with_a_group()

    @app.command()
    def go() -> None:
        _SignalledFinalizer(signum)  # dropped at once: its __del__ runs here
        for _ in range(50):
            time.sleep(0.01)
        ran_on.append("the command went on after the interrupt")

    before = sys.unraisablehook
    exit_code = _main_as_at_a_terminal(monkeypatch, app, ["go"])
    assert exit_code == code
    assert ran_on == []
    assert sys.unraisablehook is before


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129), (signal.SIGINT, 130)])
def test_a_stop_signal_the_kernel_hands_to_another_thread_still_stops_a_waiting_command(
    monkeypatch: pytest.MonkeyPatch, signum: int, code: int
) -> None:
    """The main thread waits without a timeout (as an idle event loop does); the signal goes to
    another thread, as Linux may do with a signal sent to the process. Before the relay the
    command waited until something else woke it (here, the safety write after 30 s)."""
    outcome: list[str] = []
    woken_by_the_safety: list[bool] = []
    app = _app_with_a_group()

    @app.command()
    def go() -> None:
        waiting, waker = socket.socketpair()
        idle, stopped = threading.Event(), threading.Event()
        other = threading.Thread(target=idle.wait, daemon=True)
        other.start()

        def signal_the_other_thread() -> None:
            time.sleep(0.2)
            signal.pthread_kill(other.ident or 0, signum)
            if not stopped.wait(30.0):
                woken_by_the_safety.append(True)
                waker.send(b"x")  # the test fails instead of hanging

        sender = threading.Thread(target=signal_the_other_thread, daemon=True)
        sender.start()
        try:
            waiting.recv(1)  # no timeout
            outcome.append("the wait ended without the signal")
        finally:
            stopped.set()
            idle.set()
            waiting.close()
            waker.close()

    exit_code = _main_as_at_a_terminal(monkeypatch, app, ["go"])
    assert woken_by_the_safety == [], "the signal waited for the main thread to wake by itself"
    assert outcome == []
    assert exit_code == code
