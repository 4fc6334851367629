"""A build's whole process tree ends with quantload, even when quantload is killed outright.

`cmake --build` starts ninja, which starts a compiler per job: the parent-death signal reaches
cmake only, so before the guard (`quantload.groupguard`) a SIGKILLed quantload left compilers
running. The stand-in build here is a shell that starts a grandchild and a great-grandchild.
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

from quantload.llamacpp.build import run_logged

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc; Linux signals"),
]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _tree_script(pids: Path) -> str:
    """A stand-in for cmake -> ninja -> c++: two levels of children below the command, which
    write their pids to `pids` and sleep."""
    inner = f"sleep 300 & echo $! >> {pids}; wait"
    return f"sleep 300 & echo $! >> {pids}; sh -c '{inner}' & echo $! >> {pids}; echo started; wait"


def _wait_for_pids(pids: Path, count: int) -> list[int]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if pids.is_file():
            found = [int(p) for p in pids.read_text().split()]
            if len(found) >= count:
                return found
        time.sleep(0.05)
    raise AssertionError(f"the stand-in build did not start: {pids.read_text() if pids.is_file() else ''}")


def test_the_build_tree_dies_when_quantload_is_killed_outright(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    parent_code = textwrap.dedent(
        f"""
        from pathlib import Path
        from quantload.llamacpp.build import run_logged
        run_logged(["sh", "-c", {_tree_script(pids)!r}], Path({str(tmp_path / "build.log")!r}))
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", parent_code])
    try:
        tree = _wait_for_pids(pids, 3)
        assert all(_alive(pid) for pid in tree)
        parent.send_signal(signal.SIGKILL)
        parent.wait(10)
        deadline = time.monotonic() + 15
        while any(_alive(pid) for pid in tree) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [pid for pid in tree if _alive(pid)] == [], "build processes outlived quantload"
    finally:
        if parent.poll() is None:
            parent.kill()
        for pid in _wait_for_pids(pids, 0) if pids.is_file() else []:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_build_command_s_output_and_failure_are_kept(tmp_path: Path) -> None:
    log = tmp_path / "build.log"
    run_logged(["sh", "-c", "echo '[1/2] compiling'; echo '[2/2] linking'"], log, on_line=lambda *a: None)
    assert "[2/2] linking" in log.read_text()
    from quantload.errors import ToolchainError

    with pytest.raises(ToolchainError, match="exit 3"):
        run_logged(["sh", "-c", "echo broken; exit 3"], log)
