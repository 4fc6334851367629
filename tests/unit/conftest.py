"""The unit tier starts no process: pure logic with fakes in this process, seconds each.

A test here that starts a process (a child Python, a llama.cpp tool, Locust, Prometheus, promtool,
kubectl, docker, git, quantload itself ...) fails with GUARD_MESSAGE, whichever way it starts it:
subprocess (run, Popen, check_output; asyncio's subprocesses go through Popen too), os.fork,
os.forkpty, os.posix_spawn(p), os.system, os.exec*, multiprocessing (fork, spawn or forkserver).
Such a test belongs in tests/integration, where `make test` runs it after this tier.

The guard holds while each unit test's fixtures are set up, while it runs and while its fixtures
are torn down (module-scoped fixtures included: they are set up inside a test's setup); it is
lifted between tests, so the tiers after this one in the same pytest session are not touched.
A start the code under test catches and turns into something else still fails the test.
"""

from __future__ import annotations

import multiprocessing.process
import os
import subprocess
import sys
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from types import ModuleType
from typing import Any

# Imported before any guard holds: gevent (Locust's) keeps the os.fork it finds at its import, and
# matplotlib runs fc-list once to list the system fonts where its font cache is new.
import gevent.os
import gevent.subprocess
import matplotlib.font_manager  # noqa: F401
import pytest

GUARD_MESSAGE = "unit tests start no process: move this test to tests/integration"

# os functions that start (or become) another process; the ones this platform lacks are left out
_OS_STARTS = ("fork", "forkpty", "posix_spawn", "posix_spawnp", "system", "execv", "execve")

_ORIGINAL_POPEN = subprocess.Popen


class ProcessStartInUnitTest(RuntimeError):
    """Raised where a unit test starts a process."""


def _popen_classes() -> set[type]:
    """The Popen classes a start can go through: the standard one, whatever `subprocess.Popen` is now
    (gevent's once Locust has monkey-patched), and gevent's own."""
    return {_ORIGINAL_POPEN, subprocess.Popen, gevent.subprocess.Popen}


@contextmanager
def no_process_starts(attempts: list[str]) -> Iterator[None]:
    """Every way of starting a process raises ProcessStartInUnitTest and is noted in `attempts`."""

    def refuse(what: str) -> Callable[..., Any]:
        def refused(*args: Any, **kwargs: Any) -> Any:
            attempts.append(what)
            raise ProcessStartInUnitTest(f"{GUARD_MESSAGE} (it called {what})")

        return refused

    with pytest.MonkeyPatch.context() as patch:
        for popen in _popen_classes():
            patch.setattr(popen, "_execute_child", refuse(f"{popen.__module__}.Popen"))
        for name in _OS_STARTS:
            if hasattr(os, name):
                patch.setattr(os, name, refuse(f"os.{name}"))
        try:
            import _posixsubprocess  # multiprocessing's spawn and forkserver start through it directly
        except ImportError:  # pragma: no cover - not POSIX
            pass
        else:
            patch.setattr(_posixsubprocess, "fork_exec", refuse("_posixsubprocess.fork_exec"))
        patch.setattr(multiprocessing.process.BaseProcess, "start", refuse("multiprocessing Process.start"))
        yield


def guarded(phase: str) -> Generator[None, Any, Any]:
    """One phase of a test (setup, call or teardown) under the guard; a hook wrapper's body."""
    attempts: list[str] = []
    with no_process_starts(attempts):
        try:
            result = yield
        except ProcessStartInUnitTest:
            raise
        except BaseException as error:  # the start was caught and became another failure: say so
            if attempts:
                raise ProcessStartInUnitTest(f"{GUARD_MESSAGE} (in its {phase}, it called {attempts[0]})") from error
            raise
    if attempts:  # the start was caught and the test went on: still a failure
        pytest.fail(f"{GUARD_MESSAGE} (in its {phase}, it called {', '.join(attempts)})", pytrace=False)
    return result


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from guarded("setup"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Generator[None, Any, Any]:
    return (yield from guarded("call"))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None, Any, Any]:
    return (yield from guarded("teardown"))


@pytest.fixture
def process_guard() -> ModuleType:
    """This module, for the guard's own tests (tests/unit/test_no_process_starts.py)."""
    return _THIS


_THIS = sys.modules[__name__]  # now: another conftest.py may later be imported under the same name
