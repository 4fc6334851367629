"""Every command's --help shows its text as written: a bracketed default such as [plan] or [on]
is not taken for Rich markup and dropped."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from quantload.cli.main import build_app

# what Rich would take for a markup tag: [ then a letter, #, / or @ ... ]
TAG_LIKE = re.compile(r"\\?\[([a-z#/@][^\[\]]*)\]")


def _commands(command: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, command
    for name, sub in getattr(command, "commands", {}).items():
        yield from _commands(sub, (*path, name))


COMMANDS = list(_commands(typer.main.get_command(build_app())))


@pytest.mark.parametrize("path", [path for path, _ in COMMANDS], ids=[" ".join(p) or "quantload" for p, _ in COMMANDS])
def test_bracketed_words_in_help_texts_survive(path: tuple[str, ...]) -> None:
    command = dict(COMMANDS)[path]
    texts = [command.help or "", *(getattr(param, "help", None) or "" for param in command.params)]
    wanted = {match.group(0).lstrip("\\") for text in texts for match in TAG_LIKE.finditer(text)}
    shown = CliRunner().invoke(build_app(), [*path, "--help"], env={"COLUMNS": "250"}).output
    joined = " ".join(shown.split())  # help wraps long lines
    missing = sorted(word for word in wanted if " ".join(word.split()) not in joined)
    assert not missing, f"quantload {' '.join(path)} --help lost {missing}"
