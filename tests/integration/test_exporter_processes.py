"""The exporter as a process of its own (`quantload exporter` started from the command line) and
its exposition checked by promtool: the exporter tests that start a process (the rest stay in
tests/unit/exporter: test_cli.py, test_gpu.py, test_serve.py, test_robust_targets.py).

A bad port is refused at start-up, the process serves until SIGTERM, and a target's key comes from
the environment, never from `ps`.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from fake_llama_server import FakeLlamaServer
from fake_nvml import FakeGpu, FakeNvml
from quantload.exporter import ExporterTarget, start_exporter
from quantload.exporter.gpu import GpuCollector, open_gpu_telemetry
from support import clean_env, require_binary

pytestmark = pytest.mark.integration


@pytest.fixture
def fake_servers() -> Iterator[Callable[[], FakeLlamaServer]]:
    """Start as many fake llama-servers (threads of this process) as a test asks for; all stop afterwards."""
    started: list[FakeLlamaServer] = []

    def make() -> FakeLlamaServer:
        server = FakeLlamaServer().start()
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


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


@pytest.fixture
def collectors() -> Iterator[list[GpuCollector]]:
    made: list[GpuCollector] = []
    yield made
    for collector in made:
        collector.close()


def _open(nvml: FakeNvml, made: list[GpuCollector], timeout_s: float = 1.0) -> GpuCollector:
    collector = open_gpu_telemetry(nvml.loader, timeout_s)
    assert collector is not None
    made.append(collector)
    return collector


def test_promtool_accepts_the_gpu_exposition(collectors: list[GpuCollector]) -> None:
    promtool = require_binary("promtool", "apt-get install -y prometheus")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_open(FakeNvml([FakeGpu(), FakeGpu(uuid="GPU-b")]), collectors))
    body = generate_latest(registry).decode()
    result = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_promtool_accepts_the_exposition(fake_servers: Callable[[], FakeLlamaServer]) -> None:
    promtool = require_binary("promtool", "apt-get install -y prometheus")
    fake = fake_servers()
    handle = start_exporter([ExporterTarget(name="a", url=fake.url, quant="Q8_0", model="tiny")], port=0)
    try:
        body = httpx.get(f"{handle.url}/metrics", timeout=5).text
    finally:
        handle.stop()
    result = subprocess.run(
        [promtool, "check", "metrics"], input=body, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stdout + result.stderr


SECRET = "sk-exporter-0123456789"


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://127.0.0.1:0"])
def test_a_target_with_a_bad_port_is_refused_at_start_up(url: str) -> None:
    command = [sys.executable, "-m", "quantload.cli.main", "exporter", "--target", f"x={url}", "--port", "0"]
    done = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "exporter target x" in lines[0] and "port" in lines[0], lines


def _exporter_with_key(arguments: list[str], env_key: dict[str, str]) -> tuple[str, str, str]:
    """Start `quantload exporter` with `arguments`, scrape it once; its /metrics, its command line
    as `ps` shows it, and its stderr."""
    env = {**clean_env(), **env_key}
    command = [sys.executable, "-m", "quantload.cli.main", "exporter", "--port", "0", *arguments]
    process = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stderr is not None
        seen = []
        while True:
            line = process.stderr.readline()
            assert line, "".join(seen)
            seen.append(line)
            match = re.search(r"http://127\.0\.0\.1:\d+", line)
            if match:
                break
        body = httpx.get(f"{match[0]}/metrics", timeout=10).text
        cmdline = Path(f"/proc/{process.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        process.send_signal(signal.SIGTERM)
        rest = process.stderr.read()
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    return body, cmdline, "".join(seen) + rest


@pytest.mark.skipif(not Path("/proc/self/cmdline").is_file(), reason="reads a command line in /proc")
def test_the_exporter_key_never_shows_in_ps_or_its_output(fake_servers: Callable[[], FakeLlamaServer]) -> None:
    fake = fake_servers()
    fake.api_key = SECRET
    up = 'quantload_target_up{model="m",quant="Q8_0",server="tiny"} 1.0'
    body, cmdline, stderr = _exporter_with_key(
        ["--target", f"tiny={fake.url},quant=Q8_0,model=m,api_key_env=QL_TEST_KEY"], {"QL_TEST_KEY": SECRET}
    )
    assert up in body
    assert SECRET not in cmdline and SECRET not in stderr and SECRET not in body
    body, cmdline, stderr = _exporter_with_key(
        ["--target", f"tiny={fake.url},quant=Q8_0,model=m", "--api-key-env", "QL_TEST_KEY"],
        {"QL_TEST_KEY": SECRET},
    )
    assert up in body and SECRET not in cmdline and SECRET not in stderr


def test_a_key_on_the_command_line_still_works_with_a_warning(fake_servers: Callable[[], FakeLlamaServer]) -> None:
    fake = fake_servers()
    fake.api_key = SECRET
    body, _, stderr = _exporter_with_key(["--target", f"tiny={fake.url},quant=Q8_0,model=m,api_key={SECRET}"], {})
    assert 'quantload_target_up{model="m",quant="Q8_0",server="tiny"} 1.0' in body
    assert "warning: exporter target tiny: api_key= on the command line" in stderr
    assert SECRET not in stderr
    assert os.environ.get("QL_TEST_KEY") is None
