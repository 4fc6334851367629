"""`quantload exporter` from the command line."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
from collections.abc import Callable

import httpx
import pytest

from fake_llama_server import FakeLlamaServer
from quantload.cli.main import main


def test_without_targets_it_says_how_to_give_them(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exporter"]) == 2
    assert "--target NAME=URL" in capsys.readouterr().err


def test_a_bad_target_is_a_one_line_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["exporter", "--target", "x=ftp://nowhere"]) == 2
    err = capsys.readouterr().err
    assert "not an http(s) URL" in err and "Traceback" not in err


def test_serves_until_sigterm(fake_servers: Callable[[], FakeLlamaServer]) -> None:
    fake = fake_servers()
    command = [
        sys.executable, "-m", "quantload.cli.main", "exporter",
        "--target", f"tiny={fake.url}", "--port", "0", "--timeout", "0.5",
    ]  # fmt: skip
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        lines = [process.stderr.readline() for _ in range(2)]  # the GPU telemetry line, then this
        serving = [line for line in lines if line.startswith("exporter serving")]
        assert serving, lines
        assert "GPU telemetry" in lines[0]  # said once, whether a GPU is there or not
        match = re.search(r"http://127\.0\.0\.1:\d+", serving[0])
        assert match, serving
        body = httpx.get(f"{match[0]}/metrics", timeout=10).text
        # quant and model were not given: learnt from the fake server's /props
        assert 'quantload_target_up{model="tiny",quant="Q8_0",server="tiny"} 1.0' in body
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
