"""llama-server's options as the pinned llama.cpp source declares them (common/arg.cpp).

Each `add_opt(common_arg({"-x", "--long"}, [{"--no-long"},] ...)` declares flags, optionally an
environment variable (`.set_env("LLAMA_ARG_...")`), the tools it belongs to (`.set_examples({...})`,
LLAMA_EXAMPLE_COMMON when absent: every tool) and tools it is withheld from (`.set_excludes`).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from quantload.llamacpp.sdist import source_dir
from quantload.paths import cache_root

_OPTION_START = "add_opt(common_arg("
_FLAG_GROUP = re.compile(r'\s*\{(\s*"[^"]*"(?:\s*,\s*"[^"]*")*\s*)\}\s*,')
_QUOTED = re.compile(r'"([^"]*)"')
_ENV = re.compile(r'\.set_env\("([^"]+)"\)')
_EXAMPLES = re.compile(r"\.set_examples\(\{([^}]*)\}\)")
_EXCLUDES = re.compile(r"\.set_excludes\(\{([^}]*)\}\)")
_EXAMPLE_NAME = re.compile(r"LLAMA_EXAMPLE_([A-Z_]+)")


@dataclass(frozen=True)
class LlamaOption:
    """One option of llama.cpp's common argument parser."""

    flags: frozenset[str]
    env: str | None
    examples: frozenset[str]
    excludes: frozenset[str]

    def serves(self, tool: str) -> bool:
        """Whether `tool` (e.g. "SERVER") accepts this option."""
        wanted = tool in self.examples or "COMMON" in self.examples
        return wanted and tool not in self.excludes


def arg_cpp_path() -> Path:
    """common/arg.cpp of the pinned llama.cpp tree in quantload's cache (may not exist)."""
    return source_dir(cache_root(None, os.environ)) / "common" / "arg.cpp"


def _example_names(text: str) -> frozenset[str]:
    return frozenset(_EXAMPLE_NAME.findall(text))


def parse_arg_cpp(text: str) -> list[LlamaOption]:
    """Every option declared in arg.cpp's source text."""
    options: list[LlamaOption] = []
    for chunk in text.split(_OPTION_START)[1:]:
        flags: set[str] = set()
        position = 0
        while (group := _FLAG_GROUP.match(chunk, position)) is not None:
            flags.update(_QUOTED.findall(group.group(1)))
            position = group.end()
        if not flags:
            continue
        env = _ENV.search(chunk)
        examples = _EXAMPLES.search(chunk)
        excludes = _EXCLUDES.search(chunk)
        options.append(
            LlamaOption(
                flags=frozenset(flags),
                env=env.group(1) if env else None,
                examples=_example_names(examples.group(1)) if examples else frozenset({"COMMON"}),
                excludes=_example_names(excludes.group(1)) if excludes else frozenset(),
            )
        )
    return options


def server_flags(options: list[LlamaOption]) -> set[str]:
    """Every flag llama-server accepts."""
    return {flag for option in options if option.serves("SERVER") for flag in option.flags}


def server_env(options: list[LlamaOption]) -> dict[str, LlamaOption]:
    """llama-server's environment variables, each with its option."""
    return {option.env: option for option in options if option.env and option.serves("SERVER")}


def flags_in(argv: list[str]) -> list[str]:
    """The option names in an argument list (values and negative numbers are not options)."""
    return [arg.split("=", 1)[0] for arg in argv if arg.startswith("-") and not arg.lstrip("-").isdigit()]
