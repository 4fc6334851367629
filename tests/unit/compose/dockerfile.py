"""A Dockerfile read into instructions and stages, and the build context its .dockerignore allows."""

from __future__ import annotations

import fnmatch
import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

_ARG_REFERENCE = re.compile(r"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?")


@dataclass(frozen=True)
class Instruction:
    """One instruction: keyword (upper case), the rest of the line, and its line number."""

    keyword: str
    text: str
    line: int

    def words(self) -> list[str]:
        """The arguments split like a shell would (exec-form JSON arrays are not used for COPY)."""
        return shlex.split(self.text)


@dataclass
class Stage:
    """One FROM ... and what follows it."""

    base: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def of(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


@dataclass
class Dockerfile:
    """The global ARGs (before the first FROM) and the stages."""

    global_args: dict[str, str]
    stages: list[Stage]

    def resolve(self, text: str) -> str:
        """`text` with global build arguments replaced by their defaults."""
        return _ARG_REFERENCE.sub(lambda m: self.global_args.get(m.group(1), m.group(0)), text)

    @property
    def final(self) -> Stage:
        return self.stages[-1]

    def stage(self, name: str) -> Stage:
        return next(s for s in self.stages if s.name == name)


def read_instructions(path: Path) -> list[Instruction]:
    """Instructions with continuation lines joined and comments dropped."""
    instructions: list[Instruction] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if pending and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if not pending:
            start = number
        if line.endswith("\\"):
            pending.append(line[:-1].strip())
            continue
        pending.append(line)
        joined = " ".join(part for part in pending if part)
        keyword, _, rest = joined.partition(" ")
        instructions.append(Instruction(keyword.upper(), rest.strip(), start))
        pending = []
    assert not pending, f"{path} ends inside a continued instruction"
    return instructions


def parse_dockerfile(path: Path) -> Dockerfile:
    """Global ARG defaults and the stages of a Dockerfile."""
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for instruction in read_instructions(path):
        if instruction.keyword == "FROM":
            words = instruction.text.split()
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=words[0], name=name))
        elif not stages and instruction.keyword == "ARG":
            key, _, value = instruction.text.partition("=")
            global_args[key.strip()] = value.strip()
        elif stages:
            stages[-1].instructions.append(instruction)
    return Dockerfile(global_args, stages)


def copy_sources(instruction: Instruction) -> tuple[dict[str, str], list[str], str]:
    """A COPY's flags (--from=..., --chown=...), its sources and its destination."""
    flags: dict[str, str] = {}
    paths: list[str] = []
    for word in instruction.words():
        if word.startswith("--") and not paths:
            key, _, value = word[2:].partition("=")
            flags[key] = value
        else:
            paths.append(word)
    return flags, paths[:-1], paths[-1]


def env_assignments(instruction: Instruction) -> dict[str, str]:
    """The KEY=VALUE pairs of an ENV instruction."""
    pairs: dict[str, str] = {}
    for word in instruction.words():
        key, sep, value = word.partition("=")
        assert sep, f"ENV at line {instruction.line} should use KEY=VALUE"
        pairs[key] = value
    return pairs


class DockerIgnore:
    """The patterns of a .dockerignore file; the last matching pattern decides, `!` re-includes."""

    def __init__(self, path: Path) -> None:
        self.rules: list[tuple[bool, str]] = []
        for raw in path.read_text(encoding="utf-8").splitlines():
            line = raw.strip()
            if not line or line.startswith("#"):
                continue
            include = line.startswith("!")
            pattern = line[1:] if include else line
            self.rules.append((include, pattern.strip("/")))

    @staticmethod
    def _matches(pattern: str, path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if pattern.startswith("**/"):
            tail = pattern[3:]
            return any(fnmatch.fnmatchcase(part, tail) for part in parts)
        return any(fnmatch.fnmatchcase(prefix, pattern) for prefix in prefixes)

    def sends(self, path: str) -> bool:
        """Whether `path` (relative to the context, '/'-separated) is part of the build context."""
        sent = True
        for include, pattern in self.rules:
            if self._matches(pattern, path):
                sent = include
        return sent
