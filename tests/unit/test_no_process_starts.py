"""The unit tier's guard (tests/unit/conftest.py): no unit test starts a process, by any way there is."""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable
from types import ModuleType

import pytest


def _multiprocessing(method: str) -> Callable[[], object]:
    def start() -> object:
        process = multiprocessing.get_context(method).Process(target=print)
        process.start()
        return process

    return start


async def _asyncio_child() -> object:
    return await asyncio.create_subprocess_exec(sys.executable, "-c", "pass")


STARTS: dict[str, Callable[[], object]] = {
    "subprocess.run": lambda: subprocess.run([sys.executable, "-c", "pass"], check=False),
    "subprocess.Popen": lambda: subprocess.Popen(["true"]),
    "subprocess.check_output": lambda: subprocess.check_output(["echo"]),
    "os.popen": lambda: os.popen("true"),
    "os.system": lambda: os.system("true"),
    "os.fork": lambda: os.fork(),
    "os.spawnv": lambda: os.spawnv(os.P_WAIT, "/bin/true", ["true"]),
    "os.posix_spawn": lambda: os.posix_spawn("/bin/true", ["true"], {}),
    "asyncio": lambda: asyncio.run(_asyncio_child()),
    **{f"multiprocessing {method}": _multiprocessing(method) for method in multiprocessing.get_all_start_methods()},
}


@pytest.mark.parametrize("start", list(STARTS))
def test_every_way_of_starting_a_process_is_refused_and_noted(process_guard: ModuleType, start: str) -> None:
    attempts: list[str] = []
    with process_guard.no_process_starts(attempts), pytest.raises(RuntimeError, match=process_guard.GUARD_MESSAGE):
        STARTS[start]()
    assert attempts, "the start is noted even where the code under test catches it"


def test_the_guard_holds_in_every_unit_test(process_guard: ModuleType) -> None:
    refused = (subprocess.Popen._execute_child, os.fork, multiprocessing.process.BaseProcess.start)
    assert all(getattr(f, "__qualname__", "").endswith("refused") for f in refused), refused


def _drive(phase: Callable[[], None], process_guard: ModuleType) -> None:
    """One test phase under the guard, as the hook wrappers run it."""
    wrapper = process_guard.guarded("call")
    next(wrapper)
    try:
        phase()
    except BaseException as error:
        wrapper.throw(error)
    else:
        try:
            wrapper.send(None)
        except StopIteration:
            return


def test_a_start_the_code_catches_still_fails_the_test(process_guard: ModuleType) -> None:
    def caught() -> None:
        with contextlib.suppress(Exception):
            subprocess.run(["true"], check=False)

    with pytest.raises(pytest.fail.Exception, match=process_guard.GUARD_MESSAGE):
        _drive(caught, process_guard)


def test_a_start_turned_into_another_error_fails_naming_the_start(process_guard: ModuleType) -> None:
    def converted() -> None:
        try:
            subprocess.run(["true"], check=False)
        except Exception:
            raise ValueError("the tool could not run") from None

    with pytest.raises(process_guard.ProcessStartInUnitTest, match=r"it called subprocess\.Popen"):
        _drive(converted, process_guard)


def test_a_phase_without_a_start_passes_its_outcome_on(process_guard: ModuleType) -> None:
    def failing() -> None:
        raise KeyError("missing")

    _drive(lambda: None, process_guard)
    with pytest.raises(KeyError):
        _drive(failing, process_guard)
