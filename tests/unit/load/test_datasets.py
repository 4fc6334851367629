"""Dataset files: ShareGPT JSON and JSONL conversations read with their line numbers, and every bad
file a one-line error naming the file and the line."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantload.errors import ConfigError
from quantload.load.datasets import Turn, read_dataset
from quantload.load.prompts import select_prompts

SHAREGPT = """[
  {"id": "first", "conversations": [
    {"from": "human", "value": "Hello?"},
    {"from": "gpt", "value": "Hi."},
    {"from": "human", "value": "How are you?"}
  ]},
  {"id": "empty", "conversations": []},
  {"id": "third", "conversations": [{"from": "system", "value": "be brief"}, {"from": "human", "value": "Q"}]}
]"""


def test_sharegpt_conversations_keep_user_turns_replies_and_lines(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text(SHAREGPT)
    dataset = read_dataset(path)
    assert [c.id for c in dataset.conversations] == ["first", "third"]
    first = dataset.conversations[0]
    assert first.turns == (Turn("Hello?", "Hi."), Turn("How are you?", None))
    assert (first.line, dataset.conversations[1].line) == (2, 8)
    assert dataset.skipped == 1


def test_jsonl_holds_conversations_or_single_prompts_with_output_lengths(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "tell me", "output_tokens": 40}\n\n{"messages": [{"role": "user", "content": "x"}]}\n')
    dataset = read_dataset(path)
    assert [(c.turns[0].user, c.output_tokens, c.line) for c in dataset.conversations] == [
        ("tell me", 40, 1),
        ("x", None, 3),
    ]


@pytest.mark.parametrize(
    ("name", "text", "message"),
    [
        ("missing.json", None, "does not exist"),
        ("empty.json", "  \n", "is empty"),
        ("bad.jsonl", '{"prompt": "a"}\n{"prompt": \n', "bad.jsonl:2 is not JSON"),
        ("bad.json", '[{"prompt": "a"},\n {"prompt": "b",,}]', "bad.json:2 is not valid JSON"),
        ("open.json", '[{"prompt": "a"}', "the JSON list is not closed"),
        ("scalar.jsonl", '{"prompt": "a"}\n42\n', "scalar.jsonl:2: entry 1 is not a JSON object"),
        ("noturns.jsonl", '{"id": 1, "other": 2}\n', "noturns.jsonl:1: entry 0 has no turns list and no prompt"),
        ("turns.jsonl", '{"conversations": "x"}\n', "turns.jsonl:1: conversations is not a list"),
        ("length.jsonl", '{"prompt": "a"}\n{"prompt": "b", "output_tokens": 0}\n', "length.jsonl:2: output_tokens 0"),
        ("float.jsonl", '{"prompt": "a", "completion_tokens": 2.5}\n', "float.jsonl:1: completion_tokens 2.5"),
        ("words.jsonl", '{"prompt": "a", "output_length": "ten"}\n', "output_length is 'ten', not a number"),
        ("nouser.json", '[{"conversations": [{"from": "gpt", "value": "hi"}]}]', "holds no conversation"),
    ],
)
def test_bad_dataset_files_get_one_line_naming_the_line(
    tmp_path: Path, name: str, text: str | None, message: str
) -> None:
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(ConfigError) as caught:
        read_dataset(path)
    line = caught.value.one_line()
    assert message in line and "\n" not in line


def test_an_empty_prompt_file_says_so(tmp_path: Path) -> None:
    path = tmp_path / "prompts.jsonl"
    path.write_text("\n")
    with pytest.raises(ConfigError, match="holds no prompt"):
        select_prompts(str(path), 10)
