"""Prompt sets: the 100 built-in prompts, ShareGPT files and plain JSONL files.

Every prompt is a single user turn (the first user turn of a conversation, for files that hold
whole conversations), kept in file order so every stage sends the same prompts in the same order.
Lengths are in tokens: the built-in set carries counts made with the Qwen2 tokenizer (through
llama-server's /tokenize); other files are estimated at four characters per token.
"""

from __future__ import annotations

__all__ = ["Prompt", "estimate_tokens", "load_builtin", "select_prompts"]

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import IO, Any

from quantload import json_input
from quantload.errors import ConfigError

BUILTIN = "builtin"
CHARS_PER_TOKEN = 4.0
WARMUP_PROMPT_ID = "warmup"
WARMUP_TEXT = "Reply with one short sentence: what is a warm-up request for?"


@dataclass(frozen=True)
class Prompt:
    """One user turn to send, with its length in tokens (counted or estimated)."""

    id: str
    text: str
    tokens: int
    category: str = ""

    def messages(self, system: str | None = None) -> list[dict[str, str]]:
        """Chat messages: an optional system prompt, then this user turn."""
        turns = [{"role": "system", "content": system}] if system else []
        return [*turns, {"role": "user", "content": self.text}]


def estimate_tokens(text: str) -> int:
    """A tokenizer-free length estimate (about four characters per token in English)."""
    return max(1, round(len(text) / CHARS_PER_TOKEN))


def warmup_prompt() -> Prompt:
    """The prompt warm-up requests use: not part of any measured set."""
    return Prompt(WARMUP_PROMPT_ID, WARMUP_TEXT, estimate_tokens(WARMUP_TEXT), "warmup")


def _builtin_lines() -> Iterator[str]:
    data = resources.files("quantload").joinpath("data", "prompts.jsonl")
    with data.open("r", encoding="utf-8") as handle:
        yield from handle


def load_builtin() -> list[Prompt]:
    """The 100 built-in prompts, in their fixed order."""
    prompts = []
    for line in _builtin_lines():
        if not line.strip():
            continue
        row = json.loads(line)
        text = str(row["prompt"])
        prompts.append(
            Prompt(
                str(row["id"]),
                text,
                int(row.get("tokens") or estimate_tokens(text)),
                row.get("category", ""),
            )
        )
    return prompts


def _first_user_turn(turns: Iterable[Any]) -> str | None:
    for turn in turns:
        if not isinstance(turn, Mapping):
            continue
        role = str(turn.get("from", turn.get("role", ""))).lower()
        text = turn.get("value", turn.get("content"))
        if role in ("human", "user") and isinstance(text, str) and text.strip():
            return text
    return None


def _row_text(row: Any) -> str | None:
    if isinstance(row, str):
        return row
    if not isinstance(row, Mapping):
        return None
    for key in ("prompt", "text", "content", "question", "instruction"):
        value = row.get(key)
        if isinstance(value, str) and value.strip():
            return value
    for key in ("conversations", "messages", "conversation"):
        value = row.get(key)
        if isinstance(value, list):
            return _first_user_turn(value)
    return None


def _prompt_of(index: int, row: Any) -> Prompt | None:
    text = _row_text(row)
    if text is None:
        return None
    if not isinstance(row, Mapping):
        return Prompt(str(index), text, estimate_tokens(text), "")
    tokens = row.get("tokens")
    count = tokens if isinstance(tokens, int) and not isinstance(tokens, bool) and tokens > 0 else None
    return Prompt(
        str(row.get("id", index)), text, count or estimate_tokens(text), str(row.get("category", ""))
    )


def _read(path: Path, rows: Callable[[IO[str]], Iterator[tuple[int, Any]]], sharegpt: bool) -> list[Prompt]:
    prompts = []
    try:
        with path.open(encoding="utf-8") as handle:
            for index, (line, row) in enumerate(rows(handle)):
                found = _prompt_of(index if sharegpt else line, row)
                if found is not None:
                    prompts.append(
                        found if not sharegpt else Prompt(found.id, found.text, found.tokens, "sharegpt")
                    )
    except json_input.JsonInputError as error:
        hint = "give a JSON list" if sharegpt else "one JSON value per line"
        raise ConfigError(f"{path}:{error.line} is not JSON ({error})", hint) from None
    except UnicodeDecodeError as error:
        raise ConfigError(
            f"prompt file {path} is not UTF-8 text ({error.reason})", "check load.prompts"
        ) from None
    except OSError as error:
        raise ConfigError(f"cannot read prompt file {path}: {error}", "check load.prompts") from None
    return prompts


def _jsonl_rows(handle: IO[str]) -> Iterator[tuple[int, Any]]:
    for number, line in json_input.iter_lines(handle):
        yield number, json_input.loads(line, number)


def load_sharegpt(path: Path) -> list[Prompt]:
    """First human turn of every conversation in a ShareGPT-format JSON file (read linearly)."""
    return _read(path, json_input.iter_array, sharegpt=True)


def load_jsonl(path: Path) -> list[Prompt]:
    """One prompt per line: a string, or an object with prompt/text/content or messages."""
    return _read(path, _jsonl_rows, sharegpt=False)


def load_prompt_file(path: Path) -> list[Prompt]:
    """A ShareGPT JSON list or a JSONL file, told apart by the first character."""
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            start = handle.read(1024).lstrip()
    except OSError as error:
        raise ConfigError(f"cannot read prompt file {path}: {error}", "check load.prompts") from None
    return load_sharegpt(path) if start.startswith("[") else load_jsonl(path)


def select_prompts(
    source: str,
    count: int,
    min_tokens: int = 1,
    max_tokens: int | None = None,
    cwd: Path | None = None,
) -> list[Prompt]:
    """The first `count` prompts of `source` ("builtin" or a file) within the length bounds."""
    if source == BUILTIN:
        prompts = load_builtin()
    else:
        path = Path(source).expanduser()
        if not path.is_absolute() and cwd is not None:
            path = cwd / path
        prompts = load_prompt_file(path)
        if not prompts:
            raise ConfigError(
                f"prompt file {path} holds no prompt",
                "one JSON string or object with a prompt (or ShareGPT conversations) per entry",
            )
    kept = [p for p in prompts if p.tokens >= min_tokens and (max_tokens is None or p.tokens <= max_tokens)]
    if not kept:
        raise ConfigError(
            f"no prompt in {source} is between {min_tokens} and {max_tokens} tokens",
            "widen load.min_prompt_tokens / load.max_prompt_tokens",
        )
    return kept[:count]
