"""The exporter's targets (issue 16, items 3 and 7): a bad port is refused at start-up, one bad
target never fails a scrape, and a target's key comes from the environment, never from `ps`."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from fake_llama_server import FakeLlamaServer
from quantload.errors import ConfigError
from quantload.exporter import ExporterTarget, start_exporter
from quantload.exporter.targets import parse_target, targets_from_specs
from support import clean_env

SECRET = "sk-exporter-0123456789"


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999", "http://127.0.0.1:abc", "http://127.0.0.1:0"])
def test_a_target_with_a_bad_port_is_refused_at_start_up(url: str) -> None:
    command = [sys.executable, "-m", "quantload.cli.main", "exporter", "--target", f"x={url}", "--port", "0"]
    done = subprocess.run(command, env=clean_env(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "exporter target x" in lines[0] and "port" in lines[0], lines


def test_one_bad_target_never_fails_the_scrape(fake_servers: Callable[[], FakeLlamaServer]) -> None:
    good = ExporterTarget(name="good", url=fake_servers().url, quant="Q8_0", model="m")
    # what start-up now refuses, as an older configuration or a caller could still hand it over
    bad = ExporterTarget.model_construct(name="bad", url="http://127.0.0.1:99999", quant="Q4_0", model="m")
    handle = start_exporter([good, bad], port=0, timeout_s=0.5)
    try:
        answer = httpx.get(f"{handle.url}/metrics", timeout=10)
    finally:
        handle.stop()
    assert answer.status_code == 200, answer.text[:500]
    assert 'quantload_target_up{model="m",quant="Q8_0",server="good"} 1.0' in answer.text
    assert 'quantload_target_up{model="m",quant="Q4_0",server="bad"} 0.0' in answer.text
    assert "llamacpp_tokens_predicted_total" in answer.text


def test_a_slots_answer_nested_too_deep_is_a_parse_error(fake_servers: Callable[[], FakeLlamaServer]) -> None:
    fake = fake_servers()
    fake.slots_body = b"[" * 100_000 + b"]" * 100_000
    handle = start_exporter([ExporterTarget(name="deep", url=fake.url, quant="Q8_0", model="m")], port=0)
    try:
        answer = httpx.get(f"{handle.url}/metrics", timeout=10)
    finally:
        handle.stop()
    assert answer.status_code == 200
    labels = 'endpoint="slots",error="parse",model="m",quant="Q8_0",server="deep"'
    assert f"quantload_target_scrape_errors_total{{{labels}}} 1.0" in answer.text
    assert 'quantload_target_up{model="m",quant="Q8_0",server="deep"} 1.0' in answer.text  # /metrics read


def test_a_target_key_from_an_environment_variable() -> None:
    target = parse_target("a=http://127.0.0.1:8080,api_key_env=MY_KEY", {"MY_KEY": SECRET})
    assert target.api_key_text == SECRET
    with pytest.raises(ConfigError) as unset:
        parse_target("a=http://127.0.0.1:8080,api_key_env=MY_KEY", {})
    assert "MY_KEY" in unset.value.one_line()
    with pytest.raises(ConfigError, match="both"):
        parse_target(f"a=http://127.0.0.1:8080,api_key={SECRET},api_key_env=MY_KEY", {"MY_KEY": "k"})
    # the default key still fills the targets without their own
    both = targets_from_specs(["a=http://h:1", "b=http://h:2,api_key_env=K"], "default", {"K": SECRET})
    assert [t.api_key_text for t in both] == ["default", SECRET]


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
