"""What this llama-server build accepts, read from its own `--help` (no model, no server started).

The server's help lists every flag it parses, the KV-cache types `-ctk/-ctv` allow ("allowed
values: f32, f16, ...") and the speculative decoding types `--spec-type` takes (its usage line,
"--spec-type none,draft-simple,..."). Flag spaces and experiments are checked against these
before any server starts, so a type this build lacks is one line, not a server that fails to load.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from quantload.errors import ToolchainError
from quantload.llamacpp.toolchain import Toolchain

HELP_TIMEOUT_S = 30.0
_FLAG = re.compile(r"(?:^|[\s,])(--?[a-zA-Z][\w-]*)")
_ALLOWED = re.compile(r"allowed values:\s*([\w ,.-]+)")
_SPEC_TYPES = re.compile(r"--spec-type\s+([\w,-]+)")


@dataclass(frozen=True)
class ServerBuild:
    """The flags, KV-cache types and speculation types one llama-server binary accepts."""

    flags: frozenset[str]
    cache_types: tuple[str, ...]
    spec_types: tuple[str, ...]

    def lacks_flag(self, flag: str) -> bool:
        return flag not in self.flags


def parse_server_help(text: str) -> ServerBuild:
    """The build's abilities from the text `llama-server --help` prints."""
    flags: set[str] = set()
    cache_types: tuple[str, ...] = ()
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("-"):  # a flag's line: its names, then (maybe) its description
            flags.update(match[1].rstrip("-") for match in _FLAG.finditer(" " + stripped))
    for index, line in enumerate(lines := text.splitlines()):
        if "--cache-type-k" in line and not cache_types:
            for follow in lines[index : index + 4]:
                found = _ALLOWED.search(follow)
                if found:
                    cache_types = tuple(t.strip() for t in found[1].split(",") if t.strip())
                    break
    spec = _SPEC_TYPES.search(text)
    spec_types = tuple(t for t in spec[1].split(",") if t) if spec else ()
    return ServerBuild(frozenset(flags), cache_types, spec_types)


def server_build(toolchain: Toolchain) -> ServerBuild:
    """Run `llama-server --help` (bounded) and read what the build accepts; ToolchainError when
    it cannot run or says nothing usable."""
    binary = toolchain.path("llama-server")
    try:
        done = subprocess.run(
            [str(binary), "--help"], capture_output=True, text=True, timeout=HELP_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ToolchainError(
            f"{binary} --help did not run: {error}", "rebuild it: quantload toolchain"
        ) from None
    build = parse_server_help(done.stdout + done.stderr)
    if not build.cache_types or "--parallel" not in build.flags:
        raise ToolchainError(
            f"{binary} --help does not list its flags and KV-cache types", "is it llama-server?"
        )
    return build
