"""The llama-servers the exporter reads: fixed by configuration, never by a scrape's URL."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

from quantload.errors import ConfigError

_NAME = re.compile(r"^[A-Za-z0-9_.-]+$")
_OPTION_KEYS = ("quant", "model", "api_key", "kv_cells", "log")


@dataclass(frozen=True)
class Target:
    """One llama-server: its name (the `server` label), base URL and what it serves.

    `quant` and `model` label every series; when left empty they are read once from the server's
    `/props`. `kv_cells` is the number of KV cells the server allocated; when unknown it is read
    from `log_path` (the server's `-lv 4` log) or, failing that, estimated from `/slots`.
    """

    name: str
    url: str
    quant: str = ""
    model: str = ""
    api_key: str | None = None
    kv_cells: int | None = None
    log_path: Path | None = None

    def __post_init__(self) -> None:
        if not _NAME.match(self.name):
            raise ConfigError(
                f"exporter target name {self.name!r} is not usable as a label",
                "use letters, digits, '_', '-' or '.'",
            )
        parts = urlsplit(self.url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ConfigError(
                f"exporter target {self.name}: {self.url!r} is not an http(s) URL",
                "give the server's base URL, e.g. http://127.0.0.1:8080",
            )
        object.__setattr__(self, "url", self.url.rstrip("/"))

    def endpoint(self, path: str) -> str:
        """The full URL of one of the server's endpoints, e.g. `/metrics`."""
        return f"{self.url}{path}"


def parse_target(spec: str) -> Target:
    """Parse `NAME=URL[,quant=Q][,model=M][,api_key=K][,kv_cells=N][,log=PATH]`."""
    name, sep, rest = spec.partition("=")
    if not sep or not rest:
        raise ConfigError(
            f"exporter target {spec!r} is not NAME=URL",
            "e.g. --target q8=http://127.0.0.1:8081,quant=Q8_0",
        )
    url, *options = rest.split(",")
    fields: dict[str, str] = {}
    for option in options:
        key, eq, value = option.partition("=")
        if not eq or key not in _OPTION_KEYS:
            raise ConfigError(
                f"exporter target {name}: unknown option {option!r}",
                f"options are {', '.join(k + '=...' for k in _OPTION_KEYS)}",
            )
        fields[key] = value
    kv_cells = fields.get("kv_cells")
    if kv_cells is not None and not kv_cells.isdigit():
        raise ConfigError(f"exporter target {name}: kv_cells={kv_cells!r} is not a whole number")
    log = fields.get("log")
    return Target(
        name=name.strip(),
        url=url.strip(),
        quant=fields.get("quant", ""),
        model=fields.get("model", ""),
        api_key=fields.get("api_key") or None,
        kv_cells=int(kv_cells) if kv_cells is not None else None,
        log_path=Path(log) if log else None,
    )


def check_unique(targets: Sequence[Target]) -> None:
    """Raise ConfigError when two targets share a name."""
    seen: set[str] = set()
    for target in targets:
        if target.name in seen:
            raise ConfigError(f"exporter target name {target.name!r} is given twice")
        seen.add(target.name)


def targets_from_specs(specs: Sequence[str], default_api_key: str | None = None) -> list[Target]:
    """Targets from `NAME=URL,...` specs; a target without its own key gets `default_api_key`."""
    targets = [parse_target(spec) for spec in specs]
    if default_api_key:
        targets = [t if t.api_key else replace(t, api_key=default_api_key) for t in targets]
    check_unique(targets)
    return targets
