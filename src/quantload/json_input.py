"""JSON from files a user gives (datasets, prompt files, traces, run files): bounded and linear.

Every reader of such a file goes through here, so the same bounds hold everywhere:

- depth: Python's JSON reader recurses once per nesting level and stops with a `RecursionError`
  near its recursion limit (about 1,000 levels); that becomes `JsonInputError` ("nested deeper
  than ..."), never a traceback;
- size: one JSON value (a line of a JSONL file, an element of a JSON list) holds at most
  `MAX_VALUE_BYTES`; a file is read in pieces, so memory follows the values kept, not the file;
- time: a JSON list is read element by element with `json.JSONDecoder.raw_decode` over a moving
  window, and line numbers are counted only over the text each step consumes, so reading is
  linear in the file's size (counting from the start for every element made it quadratic).

Errors carry the line they are on; readers add the file's name and what the user should do.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import IO, Any

MAX_VALUE_BYTES = 64 * 1024 * 1024  # one list element or JSONL line; a conversation is far less
READ_CHARS = 1 << 20  # how much text each read of a JSON list takes
DEPTH_TEXT = "nested deeper than Python's JSON reader goes (about 1,000 levels)"
WHITESPACE = " \t\r\n"
NUMBER_CHARS = frozenset("0123456789.eE+-")

ProgressNote = Callable[[int], None]  # called with the characters read so far


class JsonInputError(ValueError):
    """Text that is not JSON within the bounds; `line` is where it went wrong (1 = first)."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


def loads(text: str | bytes, line: int = 1) -> Any:
    """`json.loads`, with a too-deep value as JsonInputError instead of a RecursionError."""
    try:
        return json.loads(text)
    except RecursionError:
        raise JsonInputError(DEPTH_TEXT, line) from None
    except json.JSONDecodeError as error:
        raise JsonInputError(error.msg, line + error.lineno - 1) from None
    except (ValueError, TypeError) as error:  # bytes that are not UTF-8, and the like
        raise JsonInputError(
            str(error).splitlines()[0] if str(error) else type(error).__name__, line
        ) from None


def iter_lines(handle: IO[str], max_chars: int = MAX_VALUE_BYTES) -> Iterator[tuple[int, str]]:
    """(line number, text) of every non-blank line; JsonInputError for a line over `max_chars`."""
    number = 0
    while True:
        text = handle.readline(max_chars + 1)
        if not text:
            return
        number += 1
        if len(text) > max_chars and not text.endswith("\n"):
            raise JsonInputError(f"the line is longer than {max_chars:,} characters", number)
        if text.strip():
            yield number, text


class _Window:
    """The unread part of a text file, with the line number of its first character."""

    def __init__(self, handle: IO[str], progress: ProgressNote | None) -> None:
        self.handle = handle
        self.progress = progress
        self.text = ""
        self.position = 0
        self.line = 1
        self.read_chars = 0
        self.eof = False

    def more(self, at_least: int = 0) -> bool:
        """Drop what was consumed, append more text; False at the end of the file."""
        if self.eof:
            return False
        piece = self.handle.read(max(at_least, READ_CHARS))
        if not piece:
            self.eof = True
            return False
        self.text = self.text[self.position :] + piece
        self.position = 0
        self.read_chars += len(piece)
        if self.progress is not None:
            self.progress(self.read_chars)
        return True

    def consume(self, end: int) -> None:
        """Move past `end`, counting the line breaks in between."""
        self.line += self.text.count("\n", self.position, end)
        self.position = end

    def skip_whitespace(self) -> str | None:
        """The next character that is not whitespace, or None at the end of the file."""
        while True:
            while self.position < len(self.text) and self.text[self.position] in WHITESPACE:
                if self.text[self.position] == "\n":
                    self.line += 1
                self.position += 1
            if self.position < len(self.text):
                return self.text[self.position]
            if not self.more():
                return None


def iter_array(
    handle: IO[str], progress: ProgressNote | None = None, max_chars: int = MAX_VALUE_BYTES
) -> Iterator[tuple[int, Any]]:
    """(line it starts on, value) of every element of the JSON list that `handle` holds.

    Linear in the text: each element is decoded once from a window that holds it (a window too
    short for an element grows by doubling). JsonInputError for text that is not one JSON list,
    an element over `max_chars` characters, or an element nested too deep.
    """
    window = _Window(handle, progress)
    if window.skip_whitespace() != "[":
        raise JsonInputError("the file is not a JSON list (it does not start with '[')", window.line)
    window.consume(window.position + 1)
    decoder = json.JSONDecoder()
    found = window.skip_whitespace()
    if found == "]":
        _end_of_list(window)
        return
    while True:
        if found is None:
            raise JsonInputError("the JSON list is not closed (no ']' at the end)", window.line)
        yield _element(window, decoder, max_chars)
        found = window.skip_whitespace()
        if found == "]":
            _end_of_list(window)
            return
        if found != ",":
            if found is None:
                raise JsonInputError("the JSON list is not closed (no ']' at the end)", window.line)
            raise JsonInputError("Expecting ',' delimiter", window.line)
        window.consume(window.position + 1)
        found = window.skip_whitespace()
        if found == "]":
            raise JsonInputError("Expecting value (a ',' before the list's ']')", window.line)


def _end_of_list(window: _Window) -> None:
    window.consume(window.position + 1)
    if window.skip_whitespace() is not None:
        raise JsonInputError("text follows the end of the JSON list", window.line)


def _element(window: _Window, decoder: json.JSONDecoder, max_chars: int) -> tuple[int, Any]:
    """(the line it starts on, value) of the element at the window's position, consumed."""
    wanted = READ_CHARS
    while True:
        try:
            value, end = decoder.raw_decode(window.text, window.position)
        except RecursionError:
            raise JsonInputError(DEPTH_TEXT, window.line) from None
        except json.JSONDecodeError as error:
            if len(window.text) - window.position > max_chars:
                raise JsonInputError(
                    f"an element is longer than {max_chars:,} characters (or is not JSON)", window.line
                ) from None
            if window.more(wanted):
                wanted *= 2
                continue
            line = window.line + window.text.count("\n", window.position, error.pos)
            raise JsonInputError(error.msg, line) from None
        # a number cut by the window's edge decodes short ("12" of "123", "0" of "0.5"): when
        # nothing but the edge ends it, read on and decode it again
        number = isinstance(value, int | float) and not isinstance(value, bool)
        cut = end >= len(window.text) or window.text[end] in NUMBER_CHARS
        if number and cut and not window.eof and window.more(wanted):
            wanted *= 2
            continue
        line = window.line
        window.consume(end)
        return line, value
