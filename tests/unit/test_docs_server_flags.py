"""docs/server-flags.md documents every key of the server-flag sections with the default the code has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from quantload.config import BatchingSettings, RunSettings, SlotsSettings, SpeculationSettings, TuneSettings

DOC = Path(__file__).resolve().parents[2] / "docs" / "server-flags.md"
SECTIONS: dict[str, type[BaseModel]] = {
    "batching": BatchingSettings,
    "slots": SlotsSettings,
    "speculation": SpeculationSettings,
    "tune": TuneSettings,
}


def _rows() -> dict[str, str]:
    return {
        line.split("|")[1].strip(): line.split("|")[2].strip()
        for line in DOC.read_text(encoding="utf-8").splitlines()
        if line.startswith("| `")
    }


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_key_is_in_the_settings_table_with_its_default(section: str) -> None:
    rows = _rows()
    for key, field in SECTIONS[section].model_fields.items():
        default = list(field.default) if isinstance(field.default, tuple) else field.default
        assert rows.get(f"`{section}.{key}`") == f"`{json.dumps(default)}`", f"{section}.{key}"


def test_run_tune_is_documented_with_its_default() -> None:
    assert _rows().get("`run.tune`") == f"`{json.dumps(RunSettings.model_fields['tune'].default)}`"
