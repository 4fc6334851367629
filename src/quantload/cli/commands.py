"""The subcommands, listed without importing them: `quantload --help` names each one from this
table, and a subcommand's module (with its imports: pandas, scipy, the load client, docker) is
imported only when that subcommand runs or shows its own help.

Each subcommand module exposes `register(app)`, which adds its command (or its group) to `app`.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, MutableMapping
from dataclasses import dataclass
from typing import Any

import typer
import typer.main
from typer.core import TyperCommand, TyperGroup

from quantload.cli.option_defaults import show_defaults


@dataclass(frozen=True)
class CommandEntry:
    """One subcommand: its name, the module under quantload.cli that registers it, and the line
    `quantload --help` shows for it (its own help starts with the same words)."""

    name: str
    module: str
    summary: str


COMMANDS: tuple[CommandEntry, ...] = (
    CommandEntry(
        "run", "cmd_run",
        "Prepare, measure quality and speed, serve each quantization under load, and report.",
    ),
    CommandEntry(
        "report", "cmd_report",
        "Write report.md, report.html, table.csv, summary.json and plots/ for a run directory.",
    ),
    CommandEntry(
        "tune", "cmd_tune",
        "Search the tune space of llama-server flags ([tune]) per quantization.",
    ),
    CommandEntry(
        "toolchain", "cmd_toolchain",
        "Find the llama.cpp tools (QUANTLOAD_LLAMA_BIN, PATH) or build them once.",
    ),
    CommandEntry(
        "prepare", "cmd_prepare",
        "Make the files (llama-quantize, llama-imatrix) and DIR/manifest.json.",
    ),
    CommandEntry(
        "quality", "cmd_quality",
        "Measure perplexity and KL divergence from F16 with llama-perplexity.",
    ),
    CommandEntry(
        "predict", "cmd_predict",
        "Predict each file's SLO limit (users) from its measured cost curves, without serving.",
    ),
    CommandEntry(
        "speed", "cmd_speed",
        "Measure pp/tg tokens/s with llama-bench and place them on this machine's roofline.",
    ),
    CommandEntry(
        "kv", "cmd_kv",
        "Predict the KV-cache size, show the formula, and optionally check it against llama-server.",
    ),
    CommandEntry(
        "load", "cmd_load",
        "Stream chat completions at each --url in turn; one record per request, one summary per stage.",
    ),
    CommandEntry(
        "rpc-server", "cmd_rpc_server",
        "Run ggml-rpc-server on this host, for a llama-server elsewhere started with server.rpc.",
    ),
    CommandEntry(
        "load-worker", "cmd_load_worker",
        "Send a remote master's requests from this host: one Locust worker per plan.",
    ),
    CommandEntry(
        "calibrate", "cmd_calibrate",
        "Measure how accurately this machine's load client times streams.",
    ),
    CommandEntry(
        "exporter", "cmd_exporter",
        "Serve llama-servers' metrics, slot usage and KV occupancy at /metrics.",
    ),
    CommandEntry(
        "config", "cmd_config",
        "Inspect the configuration; write Prometheus' for parts on other hosts.",
    ),
    CommandEntry(
        "stack", "cmd_stack",
        "The compose stack's containers, their health, and the KV check from the servers' logs.",
    ),
)


def _plain_help(command: Any) -> None:
    """Help as plain wrapped text (click's), never Rich panels, whose narrow columns cut words; a
    group lists each subcommand's first paragraph whole, not cut to 45 characters."""
    if isinstance(command, (TyperCommand, TyperGroup)):
        command.rich_markup_mode = None
    for sub in getattr(command, "commands", {}).values():
        if not sub.short_help and sub.help:
            sub.short_help = " ".join(sub.help.split("\n\n")[0].split())
        _plain_help(sub)


def load_command(entry: CommandEntry) -> Any:
    """The click command of `entry`, its module imported now."""
    module = importlib.import_module(f"quantload.cli.{entry.module}")
    holder = typer.Typer(rich_markup_mode=None, add_completion=False)
    module.register(holder)
    command = typer.main.get_command(holder)
    found = getattr(command, "commands", {})
    if not isinstance(command, TyperCommand) and entry.name in found:
        command = found[entry.name]
    command.name = entry.name
    _plain_help(command)
    show_defaults(command, (entry.name,))
    return command


class LazyCommands(MutableMapping[str, Any]):
    """The group's table of subcommands: each loaded on first use."""

    def __init__(self, entries: tuple[CommandEntry, ...]) -> None:
        self.entries = {entry.name: entry for entry in entries}
        self.loaded: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        if name not in self.loaded:
            self.loaded[name] = load_command(self.entries[name])  # KeyError: no such command
        return self.loaded[name]

    def __setitem__(self, name: str, command: Any) -> None:
        self.loaded[name] = command

    def __delitem__(self, name: str) -> None:
        self.entries.pop(name, None)
        self.loaded.pop(name, None)

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*self.entries, *self.loaded]))

    def __len__(self) -> int:
        return len(set(self.entries) | set(self.loaded))


class LazyGroup(TyperGroup):
    """The `quantload` group: subcommands from COMMANDS, imported when used; its own help lists
    them from the table alone, in full (never cut to a short help)."""

    def __init__(self, **attrs: Any) -> None:
        super().__init__(**attrs)
        lazy = LazyCommands(COMMANDS)
        for name, command in self.commands.items():
            lazy[name] = command
        self.commands = lazy

    def format_commands(self, ctx: Any, formatter: Any) -> None:
        rows = [(entry.name, entry.summary) for entry in COMMANDS]
        with formatter.section("Commands"):
            formatter.write_dl(rows)
