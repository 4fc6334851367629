"""Children quantload starts: a secret reaches them through the environment, never their logged
command line, and they die with their parent.

Moved from tests/unit/test_childproc.py, whose other tests start no process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from quantload.childproc import LoggedProcess

pytestmark = pytest.mark.integration


def test_a_secret_goes_through_the_environment_and_never_into_the_log(tmp_path: Path) -> None:
    class Echo(LoggedProcess):
        def start(self) -> Echo:
            self.launch([sys.executable, "-c", "import os; print(len(os.environ['QL_TEST_SECRET']))"],
                        {"QL_TEST_SECRET": "s3cret-value"})
            return self

    log = tmp_path / "echo.log"
    process = Echo(log).start()
    deadline = time.monotonic() + 10
    while process.alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert process.stop(timeout_s=10) == 0
    text = log.read_text()
    assert text.splitlines()[1] == "12"  # the child read it from its environment
    assert "s3cret-value" not in text


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state == "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the parent-death signal is Linux's")
def test_a_child_dies_when_its_parent_is_killed_outright(tmp_path: Path) -> None:
    parent_code = textwrap.dedent(
        f"""
        import sys, time
        from pathlib import Path
        from quantload.childproc import LoggedProcess

        class Sleeper(LoggedProcess):
            def start(self):
                self.launch([sys.executable, "-c", "import time; time.sleep(120)"])
                return self

        child = Sleeper(Path({str(tmp_path / "child.log")!r})).start()
        print(child.pid, flush=True)
        time.sleep(120)
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code], stdout=subprocess.PIPE, text=True)
    child_pid = None
    try:
        assert parent.stdout is not None
        child_pid = int(parent.stdout.readline())
        assert not _gone(child_pid)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while not _gone(child_pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _gone(child_pid), "the child outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
        if child_pid is not None and not _gone(child_pid):
            os.kill(child_pid, signal.SIGKILL)
