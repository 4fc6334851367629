"""SIGTERM (or SIGHUP) to `quantload load` ends it like Ctrl-C: its Locust process stops with it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from quantload.load.fakeserver import FakeScript, FakeServer
from quantload.load.processes import ENTRY_MODULE
from support import clean_env

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _locust_processes_for(out: Path) -> list[str]:
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            argv = (proc / "cmdline").read_bytes().decode(errors="replace").replace("\0", " ")
            state = (proc / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if ENTRY_MODULE in argv and str(out) in argv and state != "Z":
            found.append(argv[:200])
    return found


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="looks for leftover processes in /proc")
@pytest.mark.parametrize(("stop_signal", "exit_code"), [(signal.SIGTERM, 143), (signal.SIGHUP, 129)])
def test_a_stop_signal_stops_the_load_process_too(tmp_path: Path, stop_signal: int, exit_code: int) -> None:
    script = FakeScript(ttft_ms=(20, 40), itl_ms=(20, 30), tokens=8, close_after_stream=True)
    out = tmp_path / "out"
    with FakeServer(script) as fake:
        command = [sys.executable, "-m", "quantload.cli.main", "load", "--url", fake.url, "--out", str(out),
                   "--users", "1", "--prompt-count", "100", "--max-tokens", "8", "--metrics-port", "0"]
        process = subprocess.Popen(command, env=clean_env(), cwd=tmp_path, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
        try:
            stages = out / "stages.jsonl"
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline and process.poll() is None:
                if stages.is_file() and "stage_start" in stages.read_text() and _locust_processes_for(out):
                    break
                time.sleep(0.1)
            assert _locust_processes_for(out), "the load never started"
            process.send_signal(stop_signal)
            _, stderr = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
        assert process.returncode == exit_code, stderr[-2000:]
        deadline = time.monotonic() + 10
        while _locust_processes_for(out) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _locust_processes_for(out) == []
    ends = [json.loads(line) for line in (out / "stages.jsonl").read_text().splitlines()
            if '"stage_end"' in line]
    assert ends and ends[0]["status"] == "aborted" and "interrupted" in ends[0]["reason"]
    assert os.path.getsize(out / "records.jsonl") > 0
