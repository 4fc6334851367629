"""Prompt sets, the prefix builder and the fake server's own helpers."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from quantload.errors import ConfigError, ServerError
from quantload.load.fakeserver import FakeScript, FakeServer, count_tokens, parse_directive
from quantload.load.prompts import load_builtin, load_prompt_file, select_prompts
from quantload.load.shared_prefix import build_system_prompt, erase_slots


def test_builtin_set_is_100_varied_long_tailed_prompts_in_fixed_order() -> None:
    prompts = load_builtin()
    assert len(prompts) == 100
    assert len({p.id for p in prompts}) == 100
    assert [p.id for p in prompts] == [f"p{i:03d}" for i in range(1, 101)]
    assert len({p.category for p in prompts}) >= 10
    tokens = sorted(p.tokens for p in prompts)
    assert tokens[0] <= 10  # a handful of tokens
    assert 700 <= tokens[-1] <= 1100  # up to about a thousand
    median = tokens[len(tokens) // 2]
    assert median < 120 < tokens[90]  # long tail: most are short, a few are long
    assert load_builtin() == prompts


def test_selection_filters_by_length_and_keeps_order() -> None:
    chosen = select_prompts("builtin", 10, min_tokens=20, max_tokens=200)
    assert len(chosen) == 10
    assert all(20 <= p.tokens <= 200 for p in chosen)
    ids = [p.id for p in load_builtin()]
    assert sorted(ids.index(p.id) for p in chosen) == [ids.index(p.id) for p in chosen]
    with pytest.raises(ConfigError):
        select_prompts("builtin", 5, min_tokens=5000)


def test_sharegpt_first_human_turn(tmp_path: Path) -> None:
    data = [
        {"id": "a", "conversations": [{"from": "system", "value": "sys"}, {"from": "human", "value": "Q1"},
                                      {"from": "gpt", "value": "A1"}, {"from": "human", "value": "Q2"}]},
        {"id": "b", "conversations": [{"from": "gpt", "value": "only an answer"}]},
        {"id": "c", "conversations": [{"from": "human", "value": "x" * 400}]},
    ]  # fmt: skip
    path = tmp_path / "share.json"
    path.write_text(json.dumps(data))
    prompts = load_prompt_file(path)
    assert [(p.id, p.text) for p in prompts][:1] == [("a", "Q1")]
    assert [p.id for p in prompts] == ["a", "c"]
    assert prompts[1].tokens == 100
    assert [p.id for p in select_prompts(str(path), 10, max_tokens=50)] == ["a"]


def test_jsonl_prompts_in_several_shapes(tmp_path: Path) -> None:
    path = tmp_path / "p.jsonl"
    lines = [
        json.dumps("plain string"),
        json.dumps({"id": "m", "messages": [{"role": "user", "content": "from messages"}]}),
        json.dumps({"prompt": "with tokens", "tokens": 3}),
        "",
        json.dumps({"nothing": "here"}),
    ]
    path.write_text("\n".join(lines))
    prompts = load_prompt_file(path)
    assert [p.text for p in prompts] == ["plain string", "from messages", "with tokens"]
    assert prompts[1].id == "m" and prompts[2].tokens == 3
    path.write_text("not json\n")
    with pytest.raises(ConfigError):
        load_prompt_file(path)


def test_directives_and_fake_tokenizer() -> None:
    assert parse_directive("x [[fake ttft_ms=5 fault=cut_after:2]] y") == {
        "ttft_ms": "5",
        "fault": "cut_after:2",
    }
    assert count_tokens("Hello, world!") == 4


def test_system_prompt_has_the_asked_length_by_the_servers_count() -> None:
    with FakeServer(FakeScript()) as server:
        text, tokens = build_system_prompt(server.url, 1500)
        assert abs(tokens - 1500) <= 30
        with httpx.Client() as client:
            counted = client.post(f"{server.url}/tokenize", json={"content": text}).json()["tokens"]
        assert len(counted) == tokens
        assert text.startswith("Section 1.")


def test_system_prompt_needs_tokenize() -> None:
    with FakeServer(FakeScript()) as server, pytest.raises(ServerError):
        build_system_prompt(server.url + "/nothing-here", 100)


def test_erase_slots_reports_the_state_it_left() -> None:
    with FakeServer(FakeScript(slots=3)) as server:
        assert "not erased" in erase_slots(server.url)
    with FakeServer(FakeScript(slots=3, slots_erasable=True)) as server:
        assert erase_slots(server.url) == "3 slots erased"
        assert server.stats.erased == 3


def test_the_whole_builtin_set_passes_the_default_length_filter() -> None:
    from quantload.config import LoadSettings

    load = LoadSettings()
    chosen = select_prompts(load.prompts, load.prompt_count, load.min_prompt_tokens, load.max_prompt_tokens)
    assert len(chosen) == 100  # the seed protocol sends all 100
