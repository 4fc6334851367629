"""The exporter's targets (issue 16, items 3 and 7): one bad target never fails a scrape, and a
target's key comes from the environment. (The exporter process refusing a bad port at start-up and
never showing a key in `ps`: tests/integration/test_exporter_processes.py.)"""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from fake_llama_server import FakeLlamaServer
from quantload.errors import ConfigError
from quantload.exporter import ExporterTarget, start_exporter
from quantload.exporter.targets import parse_target, targets_from_specs

SECRET = "sk-exporter-0123456789"


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
