"""The compose files as compose reads them: YAML with anchors, `${VAR...}` interpolation, ports."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[3]
BASE_FILE = REPO / "docker-compose.yml"
GPU_FILE = REPO / "docker-compose.gpu.yml"
ENV_EXAMPLE = REPO / ".env.example"
QUANTLOAD_IMAGE_PREFIX = "quantload:"

# ${NAME}, ${NAME:-default}, ${NAME-default}, ${NAME:?message}, ${NAME?message}; `$$` is a literal $.
_REFERENCE = re.compile(r"\$\$|\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?[-?])([^}]*))?\}")


class MissingVariable(Exception):
    """A `${NAME:?message}` whose variable is unset or empty."""


@dataclass(frozen=True)
class Reference:
    """One `${...}` in a compose file."""

    name: str
    operator: str  # "", ":-", "-", ":?" or "?"
    default: str


def references(text: str) -> list[Reference]:
    """Every variable reference in `text`, in order."""
    found: list[Reference] = []
    for match in _REFERENCE.finditer(text):
        if match.group(0) == "$$":
            continue
        found.append(Reference(match.group(1), match.group(2) or "", match.group(3) or ""))
    return found


def interpolate(text: str, env: Mapping[str, str]) -> str:
    """`text` with every reference replaced the way compose does it."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name, operator, argument = match.group(1), match.group(2) or "", match.group(3) or ""
        value = env.get(name)
        empty = value is None or (operator.startswith(":") and value == "")
        if operator.endswith("?") and empty:
            raise MissingVariable(f"{name}: {argument}")
        if operator.endswith("-") and empty:
            return argument
        return value or ""

    return _REFERENCE.sub(replace, text)


def interpolate_tree(node: Any, env: Mapping[str, str]) -> Any:
    """A parsed YAML tree with every string interpolated."""
    if isinstance(node, str):
        return interpolate(node, env)
    if isinstance(node, list):
        return [interpolate_tree(item, env) for item in node]
    if isinstance(node, dict):
        return {key: interpolate_tree(value, env) for key, value in node.items()}
    return node


def read_yaml(path: Path) -> dict[str, Any]:
    """A compose file parsed (anchors and merge keys resolved), not interpolated."""
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    assert isinstance(data, dict), f"{path.name} is not a mapping"
    return data


def env_example() -> dict[str, str]:
    """The assignments in .env.example (comments and blank lines skipped)."""
    values: dict[str, str] = {}
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        name, sep, value = stripped.partition("=")
        assert sep, f".env.example line is not NAME=VALUE: {line!r}"
        values[name] = value
    return values


def example_env(**overrides: str) -> dict[str, str]:
    """.env.example's values, with a stand-in for the required secret, plus `overrides`."""
    env = env_example()
    env["GRAFANA_ADMIN_PASSWORD"] = "not-a-real-password"
    env.update(overrides)
    return env


def services(data: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The services of a parsed compose file."""
    found = data.get("services") or {}
    assert isinstance(found, dict)
    return found


def command_of(service: Mapping[str, Any]) -> list[str]:
    """A service's command as a list (compose also allows one string; we always use lists)."""
    command = service.get("command")
    assert isinstance(command, list), f"command should be a list, got {command!r}"
    return [str(part) for part in command]


def environment_of(service: Mapping[str, Any]) -> dict[str, str]:
    """A service's environment as a mapping."""
    environment = service.get("environment") or {}
    assert isinstance(environment, dict), "environment should be a mapping"
    return {str(key): "" if value is None else str(value) for key, value in environment.items()}


def is_quantload(service: Mapping[str, Any]) -> bool:
    """Whether a service runs our image."""
    return str(service.get("image", "")).startswith(QUANTLOAD_IMAGE_PREFIX)


@dataclass(frozen=True)
class PortBinding:
    """One published port, short syntax `[HOST_IP:]HOST_PORT:CONTAINER_PORT[/PROTOCOL]`."""

    host_ip: str
    host_port: str
    container_port: str


def parse_port(entry: Any) -> PortBinding:
    """Parse one `ports:` entry; a binding without a host address parses with host_ip ''."""
    if isinstance(entry, dict):
        return PortBinding(
            str(entry.get("host_ip", "")), str(entry.get("published", "")), str(entry.get("target", ""))
        )
    text = str(entry).split("/", 1)[0]
    if text.startswith("["):  # [ipv6]:host:container
        host_ip, _, rest = text[1:].partition("]:")
        host_port, _, container_port = rest.partition(":")
        return PortBinding(host_ip, host_port, container_port)
    parts = text.split(":")
    if len(parts) == 3:
        return PortBinding(parts[0], parts[1], parts[2])
    if len(parts) == 2:
        return PortBinding("", parts[0], parts[1])
    return PortBinding("", "", parts[0])


def all_strings(node: Any) -> Iterator[str]:
    """Every string in a parsed YAML tree (keys excluded)."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, list):
        for item in node:
            yield from all_strings(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from all_strings(value)


def option_value(argv: list[str], option: str) -> str:
    """The value after `option` in an argument list (the first occurrence)."""
    assert option in argv, f"{option} missing from {argv}"
    return argv[argv.index(option) + 1]
