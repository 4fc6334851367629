"""`config.json`: the run's resolved configuration (secrets masked) and where each value came from.

The run writes it once, when the run directory is made; the report reads the settings back as the
same typed `Settings` (SecretStr values were written as '**********' and stay masked).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from quantload.config import ResolvedConfig, Settings, describe
from quantload.rundir import read_json


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


def load_config_file(path: Path) -> ConfigFile:
    """Read a config.json (a bare settings object is taken as its settings); ValueError when it is
    not one of this version's configurations."""
    data = read_json(path)
    if not isinstance(data, dict):
        raise ValueError("not a JSON object")
    return ConfigFile.model_validate(data if "settings" in data else {"settings": data})
