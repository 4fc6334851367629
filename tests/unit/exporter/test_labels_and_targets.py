"""Target specs and the labels learnt from /props."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantload.errors import ConfigError
from quantload.exporter.labels import (
    discover,
    model_from_filename,
    quant_from_filename,
    quant_from_ftype,
)
from quantload.exporter.targets import ExporterTarget, check_unique, parse_target


@pytest.mark.parametrize(
    ("ftype", "quant"),
    [
        ("Q4_K - Medium", "Q4_K_M"),
        ("Q8_0", "Q8_0"),
        ("F16", "F16"),
        ("all F32", "F32"),
        ("Q5_K - Small", "Q5_K_S"),
        ("IQ4_NL - 4.5 bpw", "IQ4_NL"),
    ],
)
def test_quant_from_ftype(ftype: str, quant: str) -> None:
    assert quant_from_ftype(ftype) == quant


@pytest.mark.parametrize(
    ("name", "quant", "model"),
    [
        ("/m/tiny-Q4_K_M.gguf", "Q4_K_M", "tiny"),
        ("qwen2.5-0.5b-instruct-fp16.gguf", "F16", "qwen2.5-0.5b-instruct"),
        ("model.q8_0.gguf", "Q8_0", "model"),
        ("plain.gguf", "", "plain"),
    ],
)
def test_quant_and_model_from_filename(name: str, quant: str, model: str) -> None:
    assert quant_from_filename(name) == quant
    assert model_from_filename(name) == model


def test_discover_prefers_ftype_and_survives_junk() -> None:
    found = discover({"model_ftype": "Q4_K - Medium", "model_path": "/x/tiny-F16.gguf"})
    assert (found.quant, found.model) == ("Q4_K_M", "tiny")
    assert (discover([1]).quant, discover(None).model) == ("", "")


def test_parse_target_with_options(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    target = parse_target(f"q8=http://127.0.0.1:8081/,quant=Q8_0,model=tiny,kv_cells=32768,log={log}")
    assert target == ExporterTarget(
        name="q8", url="http://127.0.0.1:8081", quant="Q8_0", model="tiny", kv_cells=32768, log_path=log
    )
    assert parse_target("a=https://h:1,api_key=k").api_key_text == "k"


@pytest.mark.parametrize(
    "spec",
    [
        "nourl",
        "x=",
        "x=ftp://h",
        "x=http://h,colour=red",
        "x=http://h,kv_cells=lots",
        "bad name=http://h",
    ],
)
def test_bad_target_specs_are_config_errors(spec: str) -> None:
    with pytest.raises(ConfigError):
        parse_target(spec)


def test_duplicate_names_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="twice"):
        check_unique([ExporterTarget(name="a", url="http://h:1"), ExporterTarget(name="a", url="http://h:2")])
