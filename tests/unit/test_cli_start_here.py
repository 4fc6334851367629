"""`quantload --help` is where a newcomer starts: it says what to run first and what `quantload run`
alone does, lists every profile and every command in full, and every command's help shows each
option's default and wraps instead of cutting. (That it imports no subcommand, seen in a fresh
interpreter: tests/integration/test_fresh_imports.py.)
"""

from __future__ import annotations

import re
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from quantload.cli.commands import COMMANDS
from quantload.cli.main import build_app
from quantload.profiles import PROFILE_NAMES

WIDTH = 100


def _help(*path: str) -> str:
    result = CliRunner().invoke(build_app(), [*path, "--help"], env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    return result.output


def _leaves(command: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    subs = getattr(command, "commands", None)
    if not subs:
        return [(path, command)]
    return [leaf for name, sub in subs.items() for leaf in _leaves(sub, (*path, name))]


LEAVES = _leaves(typer.main.get_command(build_app()))


def test_the_top_help_starts_here_and_lists_every_profile_and_command() -> None:
    shown = _help()
    start = shown.index("Start here")
    assert start < shown.index("Options:") and start < shown.index("Commands:")
    assert "quantload run --model smollm2-135m --profile quick" in shown
    assert "make run" in shown and "DATASET=" in shown
    assert "`quantload run` alone runs the full profile on qwen2.5-0.5b" in " ".join(shown.split())
    for profile in PROFILE_NAMES:
        assert f"\n    {profile} " in shown, f"profile {profile} missing from quantload --help"
    listed = "".join(shown[shown.index("Commands:") :].split())  # wrapped lines (at a hyphen, too) joined
    for entry in COMMANDS:
        assert "".join(f"{entry.name} {entry.summary}".split()) in listed  # whole, never cut short


@pytest.mark.parametrize("command", ["run", "tune"])
def test_every_profile_is_offered_where_a_profile_is_chosen(command: str) -> None:
    shown = " ".join(_help(command).split())
    offered = shown.split("--profile", 1)[1].split("--", 1)[0]
    assert all(profile in offered for profile in PROFILE_NAMES), offered


@pytest.mark.parametrize("entry", COMMANDS, ids=[entry.name for entry in COMMANDS])
def test_each_listed_summary_is_how_the_command_describes_itself(entry: Any) -> None:
    own = " ".join(_help(entry.name).split())
    first_words = entry.summary.rstrip(".").split(":")[0].split(";")[0]
    assert first_words in own, f"quantload {entry.name} --help does not start as its listing says"


@pytest.mark.parametrize("path", [path for path, _ in LEAVES], ids=[" ".join(path) for path, _ in LEAVES])
def test_every_option_shows_its_default_and_no_help_line_is_cut(path: tuple[str, ...]) -> None:
    command = dict(LEAVES)[path]
    for param in command.params:
        if param.param_type_name != "option" or param.required or param.name == "help":
            continue
        if param.is_flag and param.secondary_opts == [] and param.default in (False, None):
            continue  # a plain switch: off unless given
        text = param.help or ""
        says = "default" in text.lower() or "[" in text
        assert says or param.show_default, f"quantload {' '.join(path)} {param.opts[0]}: no default shown"
    shown = _help(*path)
    cut = re.search(r"[A-Za-z0-9,](\.\.\.|…)", shown)  # "[FILE]..." in the usage is a repeated argument
    assert cut is None, f"quantload {' '.join(path)} --help cut a line: {cut}"
    assert max(len(line) for line in shown.splitlines()) <= WIDTH
