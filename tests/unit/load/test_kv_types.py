"""The kv_types experiment's plan (pure), when a run plans it, and the servers it asks for.

Its whole path against fake servers with real Locust processes:
tests/integration/load/test_kv_types_processes.py.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from load_api import context
from quantload.config import LoadSettings, load_config
from quantload.errors import ConfigError
from quantload.experiments import registry
from quantload.experiments.base import ServerFlags
from quantload.experiments.kv_types.stages import decode_requests, kv_type_plan
from quantload.experiments.registry import run_experiment
from quantload.llamacpp.server import ServerSpec
from quantload.load.prompts import load_builtin
from quantload.served import ServedTarget
from quantload.stack.server_variants import cache_type_spec, variant_spec

TARGET = ServedTarget(name="llama-q8_0", quant="Q8_0", model="m", url="http://127.0.0.1:1")


def load_settings(**changes: object) -> LoadSettings:
    base: dict[str, object] = dict(
        warmup_requests=1, request_timeout_s=10, first_round_jitter_s=0.01, metrics_port=0,
        stage_timeout_s=60, max_tokens=99,
    )  # fmt: skip
    base.update(changes)
    return LoadSettings.model_validate(base)


def test_the_plan_is_one_decode_heavy_stage_naming_its_cache_type(tmp_path: Path) -> None:
    run = context(tmp_path, load_settings(), kv_types={"users": 8, "requests": 5, "max_tokens": 64,
                                                       "prompt_max_tokens": 20})  # fmt: skip
    drawn = decode_requests(run.settings, tmp_path)
    assert len(drawn.requests) == 5 and all(len(drawn.texts[r.prompt_id].split()) <= 20 for r in drawn.requests)
    plan = kv_type_plan(run.settings, TARGET, drawn, "run", "kv_types-x", "q4_0")
    (stage,) = plan.stages
    assert (stage.experiment, stage.users, stage.kv_cache_type, stage.cache_prompt) == ("kv_types", 8, "q4_0", False)
    assert [r.prompt_id for r in stage.requests] == [r.prompt_id for r in drawn.requests]
    assert len(stage.warmup) == 1 and stage.arrival == "closed"
    assert stage.ignore_eos is True and {r.max_tokens for r in stage.requests} == {64}  # not the sweep's 99
    line = plan.stage_event(stage, "stage_start", 1.0)
    assert line.kv_cache_type == "q4_0" and "q4_0" in (line.server_state or "")


def test_short_prompts_cycle_when_too_few_are_short_and_name_the_key_when_none_are(tmp_path: Path) -> None:
    shortest = min(p.tokens for p in load_builtin())
    few = decode_requests(context(tmp_path, kv_types={"requests": 7, "prompt_max_tokens": shortest}).settings,
                          tmp_path)  # fmt: skip
    assert len(few.requests) == 7 and len({r.prompt_id for r in few.requests}) < 7
    long_only = tmp_path / "long.jsonl"
    long_only.write_text('{"prompt": "%s"}\n' % ("word " * 200), encoding="utf-8")
    settings = context(tmp_path, load_settings(prompts=str(long_only)), kv_types={"prompt_max_tokens": 10})
    with pytest.raises(ConfigError) as caught:
        decode_requests(settings.settings, tmp_path)
    assert caught.value.hint == "raise kv_types.prompt_max_tokens"


def test_run_plans_kv_types_last_only_with_two_cache_types_and_requests(tmp_path: Path) -> None:
    def planned(**flags: object) -> list[str]:
        return [e.name for e in registry.planned(load_config(tmp_path, {}, flags).settings)]

    assert planned()[-1] == "kv_types"
    assert "kv_types" not in planned(**{"quality.kld_cache_types": ["f16"]})
    assert "kv_types" not in planned(**{"kv_types.requests": 0})
    with pytest.raises(ConfigError, match="starts llama-servers of its own"):
        registry.against_any_server(["kv_types"])  # `quantload load` cannot serve other cache types
    with pytest.raises(ConfigError, match="starts llama-servers of its own"):
        run_experiment("kv_types", TARGET, context(tmp_path))


def test_a_variant_is_the_servers_spec_with_the_flags_applied() -> None:
    spec = ServerSpec(model_path=Path("m.gguf"), alias="m-Q8_0", port=8080, extra_args=("-t", "2"))
    flags = ServerFlags(slots=2, ctx_per_slot=1024, cache_type="q8_0", extra_args=("-nocb",))
    made = variant_spec(spec, flags)
    assert (made.slots, made.ctx_per_slot, made.cache_type_k, made.cache_type_v, made.port) == (
        2, 1024, "q8_0", "q8_0", 8080,
    )  # fmt: skip
    assert made.extra_args == ("-t", "2", "-nocb", "-fa", "on")
    assert variant_spec(spec, ServerFlags()) == spec


def test_a_cache_type_server_is_the_same_spec_with_its_types_and_flash_attention_where_needed() -> None:
    spec = ServerSpec(model_path=Path("m.gguf"), alias="m-Q8_0", port=8080, api_key="k", extra_args=("-t", "2"))
    q8 = cache_type_spec(spec, "q8_0")
    assert (q8.cache_type_k, q8.cache_type_v, q8.port, q8.api_key) == ("q8_0", "q8_0", 0, "k")
    assert q8.extra_args == ("-t", "2", "-fa", "on")  # llama.cpp refuses a quantized V cache without it
    command = q8.command(Path("llama-server"), 1)
    assert command[command.index("-ctk") + 1] == command[command.index("-ctv") + 1] == "q8_0"
    assert cache_type_spec(spec, "f16").extra_args == ("-t", "2")  # auto, as the f16 KLD runs
    chosen = dataclasses.replace(spec, extra_args=("-fa", "off"))
    assert cache_type_spec(chosen, "q4_0").extra_args == ("-fa", "off")  # the user's own choice stays
