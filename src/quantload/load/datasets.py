"""Datasets of real conversations: ShareGPT JSON files and JSONL files, read with line numbers.

A ShareGPT file is a JSON list of objects whose `conversations` (or `messages`) list holds turns
`{"from": "human"|"gpt", "value": ...}` (or `{"role": "user"|"assistant", "content": ...}`).
A JSONL file holds one such object per line, or a single request per line:
`{"prompt": "...", "output_tokens": 200}` (output length also as `completion_tokens` or
`output_length`). Workloads take from each conversation its user turns and, as the output length
to ask for, the length of the reply that followed each one in the dataset (or the line's own
`output_tokens`).

Every problem is one line naming the file and the line: a missing or empty file, text that is not
JSON, an entry that is not an object or has no turns list, an impossible length, a value nested
deeper than Python's JSON reader goes. Entries with no user turn are skipped and counted. The file
is read in pieces and linearly (`quantload.json_input`), with progress as it goes: a 670 MB
ShareGPT list takes seconds, not hours (benchmarks/dataset_reading.py).
"""

from __future__ import annotations

__all__ = ["read_dataset"]

import io
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from quantload import json_input
from quantload.errors import ConfigError
from quantload.json_input import ProgressNote
from quantload.progress import ProgressCallback, no_progress

USER_ROLES = frozenset({"human", "user"})
ASSISTANT_ROLES = frozenset({"gpt", "assistant", "chatgpt", "bard", "model", "bot"})
TURN_LISTS = ("conversations", "messages", "conversation")
PROMPT_KEYS = ("prompt", "text", "question", "instruction")
OUTPUT_FIELDS = ("output_tokens", "completion_tokens", "output_length")
MAX_TOKENS_PER_REQUEST = 10_000_000


@dataclass(frozen=True)
class Turn:
    """One user turn and the reply the dataset gives it (None when it ends the conversation)."""

    user: str
    reply: str | None


@dataclass(frozen=True)
class Conversation:
    """One dataset entry: its id, its user turns with their replies, where it is in the file."""

    id: str
    turns: tuple[Turn, ...]
    line: int
    output_tokens: int | None = None  # the entry's own output length (single-request JSONL)


@dataclass(frozen=True)
class Dataset:
    """The usable conversations of a file, and how many entries had no user turn."""

    path: Path
    conversations: tuple[Conversation, ...]
    skipped: int


def _where(path: Path, line: int) -> str:
    return f"{path}:{line}"


def _output_tokens(path: Path, line: int, row: dict[str, Any]) -> int | None:
    for name in OUTPUT_FIELDS:
        if name not in row:
            continue
        value = row[name]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ConfigError(f"{_where(path, line)}: {name} is {value!r}, not a number of tokens")
        if value != int(value) or not 1 <= value <= MAX_TOKENS_PER_REQUEST:
            raise ConfigError(
                f"{_where(path, line)}: {name} {value!r} is not a possible length",
                f"a whole number from 1 to {MAX_TOKENS_PER_REQUEST:,}",
            )
        return int(value)
    return None


def _turns(path: Path, line: int, listed: list[Any]) -> tuple[Turn, ...]:
    turns: list[Turn] = []
    pending: str | None = None
    for item in listed:
        if not isinstance(item, dict):
            raise ConfigError(
                f"{_where(path, line)}: a turn is not an object", 'e.g. {"from": "human", "value": "..."}'
            )
        role = str(item.get("from", item.get("role", ""))).lower()
        text = item.get("value", item.get("content"))
        if not isinstance(text, str) or not text.strip():
            continue
        if role in USER_ROLES:
            if pending is not None:
                turns.append(Turn(pending, None))
            pending = text
        elif role in ASSISTANT_ROLES and pending is not None:
            turns.append(Turn(pending, text))
            pending = None
    if pending is not None:
        turns.append(Turn(pending, None))
    return tuple(turns)


def _entry(path: Path, line: int, index: int, row: Any) -> Conversation | None:
    if not isinstance(row, dict):
        raise ConfigError(
            f"{_where(path, line)}: entry {index} is not a JSON object", "one conversation object per entry"
        )
    ident = str(row.get("id", index))
    output = _output_tokens(path, line, row)
    for key in TURN_LISTS:
        listed = row.get(key)
        if listed is None:
            continue
        if not isinstance(listed, list):
            raise ConfigError(f"{_where(path, line)}: {key} is not a list of turns")
        turns = _turns(path, line, listed)
        return Conversation(ident, turns, line, output) if turns else None
    for key in PROMPT_KEYS:
        value = row.get(key)
        if isinstance(value, str) and value.strip():
            return Conversation(ident, (Turn(value, None),), line, output)
    raise ConfigError(
        f"{_where(path, line)}: entry {index} has no turns list and no prompt",
        f"give one of {', '.join((*TURN_LISTS, *PROMPT_KEYS))}",
    )


def _rows(path: Path, handle: IO[str], progress: ProgressNote) -> Iterator[tuple[int, Any]]:
    """(line, value) of every entry: the elements of a JSON list, or the lines of a JSONL file."""
    start = handle.read(1024)
    while start and not start.strip():
        start = handle.read(1024)
    if not start:
        raise ConfigError(f"dataset file {path} is empty", "give a ShareGPT JSON list or a JSONL file")
    handle.seek(0)
    if start.lstrip().startswith("["):
        yield from json_input.iter_array(handle, progress)
        return
    for number, line in json_input.iter_lines(handle):
        try:
            yield number, json_input.loads(line, number)
        except json_input.JsonInputError as error:
            raise ConfigError(
                f"{_where(path, number)} is not JSON ({error})", "one JSON object per line"
            ) from None


def read_dataset(path: Path, progress: ProgressCallback = no_progress) -> Dataset:
    """Every conversation of a ShareGPT JSON or JSONL file (see the module docstring).

    The file is read in pieces, linearly, and `progress` hears the bytes read so far of the
    file's size and the conversations found; every problem is a ConfigError naming the line.
    """
    try:
        size = path.stat().st_size
        binary = path.open("rb")
    except FileNotFoundError:
        raise ConfigError(f"dataset file {path} does not exist", "check the dataset path") from None
    except OSError as error:
        raise ConfigError(f"cannot read dataset file {path}: {error}") from None
    conversations: list[Conversation] = []
    skipped = 0

    def note(_chars: int) -> None:
        done = binary.tell()
        progress(
            done,
            size,
            f"reading {path.name}: {done / 1e6:,.0f} of {size / 1e6:,.0f} MB,"
            f" {len(conversations):,} conversations",
        )

    with binary, io.TextIOWrapper(binary, encoding="utf-8") as handle:
        try:
            for index, (line, row) in enumerate(_rows(path, handle, note)):
                found = _entry(path, line, index, row)
                if found is None:
                    skipped += 1
                else:
                    conversations.append(found)
        except UnicodeDecodeError as error:
            raise ConfigError(
                f"dataset file {path} is not UTF-8 text ({error.reason})",
                "give a ShareGPT JSON list or a JSONL file",
            ) from None
        except json_input.JsonInputError as error:
            raise ConfigError(
                f"{_where(path, error.line)} is not valid JSON: {error}",
                "give a ShareGPT JSON list or a JSONL file",
            ) from None
        except OSError as error:
            raise ConfigError(f"cannot read dataset file {path}: {error}") from None
    progress(size, size, f"read {path.name}: {len(conversations):,} conversations")
    if not conversations:
        raise ConfigError(
            f"dataset file {path} holds no conversation with a user turn",
            'ShareGPT turns are {"from": "human", "value": ...}',
        )
    return Dataset(path, tuple(conversations), skipped)
