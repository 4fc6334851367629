"""The llama-servers the exporter reads: fixed by configuration, never by a scrape's URL.

A target's API key comes, in this order, from its `api_key_env=VAR` option (the environment
variable VAR holds it), from its `api_key=K` option (kept working, but a key on a command line is
shown to everyone by `ps`: the CLI warns), or from the default key (`server.api_key`, e.g.
QUANTLOAD_SERVER__API_KEY, or the variable named by `quantload exporter --api-key-env`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from pydantic import SecretStr

from quantload.errors import ConfigError
from quantload.served import ServedTarget

_OPTION_KEYS = ("quant", "model", "api_key", "api_key_env", "kv_cells", "log", "gpus")


class ExporterTarget(ServedTarget):
    """A served target plus what only the exporter needs to read its KV occupancy.

    The `server`, `quant` and `model` labels of every series are the served target's, so the
    exporter's series join the load's records; when `quant` or `model` is empty it is read once
    from the server's `/props`. `kv_cells` is the number of KV cells the server allocated; when
    unknown it is read from `log_path` (the server's `-lv 4` log) or, failing that, estimated from
    `/slots`. `gpus` names the GPUs the server uses (NVML indexes, GPU or MIG UUIDs) where its
    log cannot tell them (exporter.placement).
    """

    kv_cells: int | None = None
    log_path: Path | None = None
    gpus: tuple[str, ...] = ()

    @classmethod
    def of(
        cls, served: ServedTarget, kv_cells: int | None = None, log_path: Path | None = None
    ) -> ExporterTarget:
        """The exporter's view of `served` (its API key included)."""
        return cls(
            name=served.name,
            quant=served.quant,
            model=served.model,
            url=served.url,
            api_key=served.api_key,
            kv_cells=kv_cells,
            log_path=log_path,
        )


def secret_options(spec: str) -> bool:
    """Whether a target spec carries a key in clear (`api_key=`)."""
    return any(option.strip().startswith("api_key=") for option in spec.split(",")[1:])


def parse_target(spec: str, environ: Mapping[str, str] | None = None) -> ExporterTarget:
    """Parse `NAME=URL[,quant=Q][,model=M][,api_key_env=VAR|api_key=K][,kv_cells=N][,log=PATH]
    [,gpus=ID+ID...]` (a GPU's NVML index, GPU-... or MIG-... UUID; `+` between several).

    `api_key_env=VAR` reads the key from `environ` (default: this process's environment)."""
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
    api_key = fields.get("api_key")
    variable = fields.get("api_key_env")
    if variable is not None:
        if api_key is not None:
            hint = "give api_key_env only"
            raise ConfigError(f"exporter target {name}: both api_key and api_key_env", hint)
        api_key = (os.environ if environ is None else environ).get(variable)
        if not api_key:
            raise ConfigError(
                f"exporter target {name}: api_key_env={variable} names an unset or empty variable",
                f"export {variable}=<the server's key>",
            )
    try:
        return ExporterTarget(
            name=name.strip(),
            url=url.strip(),
            quant=fields.get("quant", ""),
            model=fields.get("model", ""),
            api_key=SecretStr(api_key) if api_key else None,
            kv_cells=int(kv_cells) if kv_cells is not None else None,
            log_path=Path(log) if log else None,
            gpus=tuple(part.strip() for part in fields.get("gpus", "").split("+") if part.strip()),
        )
    except ConfigError as error:
        raise ConfigError(f"exporter target {name}: {error.problem}", error.hint) from None


def check_unique(targets: Sequence[ServedTarget]) -> None:
    """Raise ConfigError when two targets share a name."""
    seen: set[str] = set()
    for target in targets:
        if target.name in seen:
            raise ConfigError(f"exporter target name {target.name!r} is given twice")
        seen.add(target.name)


def targets_from_specs(
    specs: Sequence[str], default_api_key: str | None = None, environ: Mapping[str, str] | None = None
) -> list[ExporterTarget]:
    """Targets from `NAME=URL,...` specs; a target without its own key gets `default_api_key`."""
    targets = [parse_target(spec, environ) for spec in specs]
    if default_api_key:
        secret = SecretStr(default_api_key)
        targets = [t if t.api_key else t.model_copy(update={"api_key": secret}) for t in targets]
    check_unique(targets)
    return targets
