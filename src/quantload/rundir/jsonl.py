"""The one rule for reading a run's JSONL files (records.jsonl, stages.jsonl, limits.jsonl).

Every non-blank line is parsed through its model; a line that does not parse (torn by a crash,
foreign, nested too deep, longer than `MAX_LINE_CHARS`) is never dropped unseen: it is counted,
with its line number, in a `BadLines` tally that the reader hands back, and the report names them
in its notes. A file that is still being written may end in a torn line; a reader that follows
such a file reads it again later (`load.supervisor.NewLines`), and a finished run's torn last line
is one more bad line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from pydantic import ValidationError

from quantload import json_input

T = TypeVar("T")
MAX_LINE_CHARS = json_input.MAX_VALUE_BYTES
NAMED_LINES = 5  # line numbers a note names; the rest are counted


@dataclass
class BadLines:
    """The lines of one file that could not be read: how many, and the first ones' numbers."""

    file: str
    count: int = 0
    numbers: list[int] = field(default_factory=list)

    def add(self, number: int) -> None:
        self.count += 1
        if len(self.numbers) < NAMED_LINES:
            self.numbers.append(number)

    def note(self) -> str | None:
        """The report's line about them, or None when every line was read."""
        if not self.count:
            return None
        named = ", ".join(str(number) for number in self.numbers)
        more = f" and {self.count - len(self.numbers)} more" if self.count > len(self.numbers) else ""
        which = "line" if self.count == 1 else "lines"
        return (
            f"{self.count} {which} of {self.file} could not be read (torn, foreign or damaged:"
            f" {which} {named}{more}) and were left out"
        )


def iter_jsonl(path: Path, parse: Callable[[str], T], bad: BadLines | None = None) -> Iterator[T]:
    """`parse(line)` of every non-blank line of `path` (none when it is absent); a line that does
    not parse (ValueError, which pydantic's ValidationError is, or a line over the size bound) is
    counted in `bad`."""
    if not path.is_file():
        return
    with path.open(encoding="utf-8", errors="replace") as handle:
        number = 0
        while True:
            line = handle.readline(MAX_LINE_CHARS + 1)
            if not line:
                return
            number += 1
            if len(line) > MAX_LINE_CHARS and not line.endswith("\n"):
                while (rest := handle.readline(MAX_LINE_CHARS)) and not rest.endswith("\n"):
                    pass  # the rest of the over-long line
                if bad is not None:
                    bad.add(number)
                continue
            if not line.strip():
                continue
            try:
                item = parse(line)
            except (ValueError, ValidationError, TypeError, KeyError, RecursionError):
                if bad is not None:
                    bad.add(number)
                continue
            yield item
