"""One description of a served target: its naming rules, its checks, and a key that never leaks."""

from __future__ import annotations

import pytest
from pydantic import SecretStr

from load_api import sweep_of
from quantload.config import LoadSettings
from quantload.errors import ConfigError
from quantload.exporter.targets import ExporterTarget
from quantload.load.plan import LoadPlan
from quantload.load.prompts import Prompt
from quantload.served import ServedTarget, model_of_alias, server_alias, server_name


def test_one_place_names_a_quantization_s_server() -> None:
    assert server_name("Q4_K_M") == "llama-q4_k_m"
    assert server_alias("smollm2-135m", "Q8_0") == "smollm2-135m-Q8_0"
    assert model_of_alias(server_alias("qwen2.5-0.5b-instruct", "F16"), "F16") == "qwen2.5-0.5b-instruct"
    target = ServedTarget.for_quant("Q8_0", "tiny", "http://127.0.0.1:8080/", api_key="k")
    assert (target.name, target.quant, target.model, target.url) == (
        "llama-q8_0", "Q8_0", "tiny", "http://127.0.0.1:8080",
    )  # fmt: skip
    assert target.endpoint("/metrics") == "http://127.0.0.1:8080/metrics"


def test_the_exporter_target_is_the_served_target_plus_its_kv_sources() -> None:
    served = ServedTarget.for_quant("F16", "tiny", "http://127.0.0.1:1", api_key="k")
    scraped = ExporterTarget.of(served, kv_cells=4096)
    assert isinstance(scraped, ServedTarget)
    assert (scraped.name, scraped.quant, scraped.model, scraped.url) == (
        served.name, served.quant, served.model, served.url,
    )  # fmt: skip
    assert scraped.api_key_text == "k" and scraped.kv_cells == 4096


@pytest.mark.parametrize(
    ("name", "url", "problem"),
    [("bad name", "http://h:1", "not usable as a label"), ("ok", "ftp://h", "not an http\\(s\\) URL")],
)
def test_bad_names_and_urls_are_config_errors(name: str, url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        ServedTarget(name=name, url=url)


def test_the_api_key_never_reaches_a_plan_a_dump_or_a_repr() -> None:
    target = ServedTarget(name="s", quant="Q8_0", model="m", url="http://h:1", api_key=SecretStr("sk-s3cret"))
    plan = sweep_of(LoadSettings(users=(1,)), target, [Prompt("p", "hi", 1)], "run", "inv")
    for text in (plan.model_dump_json(), target.model_dump_json(), repr(target), repr(plan), str(target)):
        assert "sk-s3cret" not in text
    assert target.api_key_text == "sk-s3cret"
    assert LoadPlan.model_validate_json(plan.model_dump_json()).target.api_key is None
