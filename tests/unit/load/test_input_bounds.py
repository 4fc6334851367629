"""Every reader of a file the user gives is bounded: JSON nested deep, bytes that are not text and
lists read in pieces end in one line naming the file and the line, never a traceback."""

from __future__ import annotations

import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from quantload import json_input
from quantload.errors import ConfigError
from quantload.load.datasets import read_dataset
from quantload.load.prompts import select_prompts
from quantload.load.trace import read_trace
from quantload.quality.results import load_quality_file
from quantload.rundir import read_json

DEEP = 100_000


def _deep(value_at: str) -> str:
    return value_at.replace("DEEP", "[" * DEEP + "]" * DEEP)


READERS: dict[str, tuple[str, Callable[[Path], Any]]] = {
    "dataset JSON list": (_deep("[DEEP]"), read_dataset),
    "dataset JSON list, deep inside an entry": (
        _deep('[{"conversations": [{"from": "human", "value": "hi"}], "x": DEEP}]'),
        read_dataset,
    ),
    "dataset JSONL": (_deep('{"prompt": DEEP}\n'), read_dataset),
    "prompt file JSON list": (_deep("[DEEP]"), lambda path: select_prompts(str(path), 5)),
    "prompt file JSONL": (
        _deep('{"prompt": "x"}\n{"prompt": DEEP}\n'),
        lambda path: select_prompts(str(path), 5),
    ),
    "trace line": (_deep('{"timestamp": 0, "input_length": DEEP, "output_length": 1}\n'), read_trace),
}


@pytest.mark.parametrize("name", list(READERS))
def test_json_nested_deeper_than_python_reads_is_one_line_naming_the_line(name: str, tmp_path: Path) -> None:
    text, reader = READERS[name]
    path = tmp_path / "input.json"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        reader(path)
    message = caught.value.one_line()
    assert f"{path}:" in message and "nested deeper" in message, message
    assert "\n" not in message


def test_a_run_file_nested_too_deep_is_a_value_error_the_report_turns_into_a_gap(tmp_path: Path) -> None:
    path = tmp_path / "quality.json"
    path.write_text(_deep('{"results": DEEP}'), encoding="utf-8")
    with pytest.raises(ValueError, match="nested deeper"):
        read_json(path)
    with pytest.raises(ConfigError, match=r"not a quantload\.quality file"):
        load_quality_file(path)


@pytest.mark.parametrize(
    "reader",
    [read_dataset, lambda path: select_prompts(str(path), 5), read_trace],
    ids=["dataset", "prompts", "trace"],
)
def test_bytes_that_are_not_text_are_refused_in_one_line(
    reader: Callable[[Path], Any], tmp_path: Path
) -> None:
    path = tmp_path / "binary.json"
    path.write_bytes(b"[" + bytes(range(128, 256)) * 40)
    with pytest.raises(ConfigError, match="not UTF-8 text"):
        reader(path)


def _sharegpt(count: int) -> str:
    entries = [
        {"id": f"c{i}", "conversations": [{"from": "human", "value": f"question {i} " + "é" * (i % 7)},
                                          {"from": "gpt", "value": "answer " * (i % 13)}]}
        for i in range(count)
    ]  # fmt: skip
    return json.dumps(entries, indent=2, ensure_ascii=False)


def test_a_json_list_read_in_small_pieces_gives_every_entry_and_its_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    text = _sharegpt(300)
    monkeypatch.setattr(json_input, "READ_CHARS", 97)  # every element crosses a piece's edge
    path = tmp_path / "sharegpt.json"
    path.write_text(text, encoding="utf-8")
    dataset = read_dataset(path)
    assert [c.id for c in dataset.conversations] == [f"c{i}" for i in range(300)]
    starts = [number for number, line in enumerate(text.splitlines(), start=1) if line == "  {"]
    assert [c.line for c in dataset.conversations] == starts


def test_a_broken_entry_far_into_a_list_names_its_own_line(tmp_path: Path) -> None:
    text = _sharegpt(2000)
    cut = text.rindex('"from": "gpt"')
    path = tmp_path / "sharegpt.json"
    path.write_text(text[:cut] + '"from" "gpt"' + text[cut + len('"from": "gpt"') :], encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        read_dataset(path)
    line = text[:cut].count("\n") + 1
    assert f"{path}:{line} is not valid JSON" in caught.value.one_line()


def test_reading_a_dataset_reports_progress_in_bytes_of_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(json_input, "READ_CHARS", 4096)
    path = tmp_path / "sharegpt.json"
    path.write_text(_sharegpt(500), encoding="utf-8")
    heard: list[tuple[float, float | None, str]] = []
    read_dataset(path, lambda done, total, note="": heard.append((done, total, note)))
    size = path.stat().st_size
    assert len(heard) > 3 and all(total == size for _, total, _ in heard)
    assert [done for done, _, _ in heard] == sorted(done for done, _, _ in heard) and heard[-1][0] == size
    assert "conversations" in heard[1][2] and path.name in heard[1][2]


def test_a_value_over_the_size_bound_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(json_input.JsonInputError, match="longer than 100 characters"):
        list(json_input.iter_array(io.StringIO('["' + "x" * 500), max_chars=100))
    with pytest.raises(json_input.JsonInputError, match="longer than 100"):
        list(json_input.iter_lines(io.StringIO("y" * 500 + "\n"), max_chars=100))


@pytest.mark.parametrize(
    ("text", "problem"),
    [("", "not a JSON list"), ("{}", "not a JSON list"), ("[1, 2", "not closed"), ("[1] 2", "text follows")],
)
def test_what_is_not_one_json_list_says_so(text: str, problem: str) -> None:
    with pytest.raises(json_input.JsonInputError, match=problem):
        list(json_input.iter_array(io.StringIO(text)))


def test_a_number_cut_by_a_piece_edge_is_read_whole(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_input, "READ_CHARS", 4)
    assert [value for _, value in json_input.iter_array(io.StringIO("[1234567, -0.5e10, 8]"))] == [
        1234567,
        -0.5e10,
        8,
    ]


def test_a_config_file_or_environment_list_nested_too_deep_is_one_line(tmp_path: Path) -> None:
    from quantload.config import load_config

    (tmp_path / "quantload.toml").write_text("[load]\nusers = " + "[" * 100_000 + "]" * 100_000 + "\n")
    with pytest.raises(ConfigError, match="deeper than Python's TOML reader goes"):
        load_config(tmp_path, {})
    deep_list = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ConfigError, match="is not a JSON list"):
        load_config(tmp_path / "elsewhere", {"QUANTLOAD_LOAD__USERS": deep_list})


def test_a_model_config_json_nested_too_deep_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from quantload.cli.main import main

    config = tmp_path / "config.json"
    config.write_text('{"x": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert main(["kv", str(config)]) == 2
    err = capsys.readouterr().err
    assert "nested deeper" in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
