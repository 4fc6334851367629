"""`config.json`: the run's resolved configuration (secrets masked) and where each value came from.

`quantload run` and `quantload tune` write it once, when the run directory is made; `quantload
load` writes it into its --out (the latest load's, unless the folder is a run's), so every report
section reads the settings a load ran with (its tenants, its contexts). The report reads the
settings back as the same typed `Settings` (SecretStr values were written as '**********' and stay
masked).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from quantload.config import ResolvedConfig, Settings, describe
from quantload.rundir import RunPaths, read_json, write_json_atomic


class ConfigFile(BaseModel):
    """The whole config.json: {"settings": {section: {key: value}}, "sources": {dotted key: layer}}."""

    model_config = ConfigDict(extra="ignore", frozen=True)

    settings: Settings
    sources: dict[str, str] = Field(default_factory=dict)

    @classmethod
    def of(cls, config: ResolvedConfig) -> ConfigFile:
        """What a run records of its configuration."""
        return cls(settings=config.settings, sources={key: source for key, _, source in describe(config)})

    def to_json(self) -> dict[str, Any]:
        """The JSON object as written to disk."""
        return {"settings": self.settings.model_dump(mode="json"), "sources": dict(self.sources)}


def write_run_config(run_dir: Path, config: ResolvedConfig) -> Path:
    """The configuration of a run into its run directory's config.json; the path written."""
    path = RunPaths(run_dir).config_path
    write_json_atomic(path, ConfigFile.of(config).to_json())
    return path


def write_load_config(out: Path, config: ResolvedConfig) -> Path | None:
    """The configuration of a `quantload load` into its --out, unless a run wrote its own there
    (run.json beside it); returns the path written, or None."""
    if RunPaths(out).run_file_path.is_file():
        return None
    out.mkdir(parents=True, exist_ok=True)
    return write_run_config(out, config)


def load_config_file(path: Path) -> ConfigFile:
    """Read a config.json (a bare settings object is taken as its settings); ValueError when it is
    not one of this version's configurations."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return ConfigFile.model_validate(data if "settings" in data else {"settings": data})
