"""docs/traffic.md documents every key of the traffic sections with the default the code has."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import BaseModel

from quantload.config import (
    ContextSettings,
    LimitSettings,
    MixedSettings,
    NoisyNeighbourSettings,
    PredictSettings,
    RampUpSettings,
    SessionSettings,
    SloSettings,
    SoakSettings,
    TenantSettings,
    TraceSettings,
    WorkloadSettings,
)

DOC = Path(__file__).resolve().parents[2] / "docs" / "traffic.md"
SECTIONS: dict[str, type[BaseModel]] = {
    "workload": WorkloadSettings, "sessions": SessionSettings, "trace": TraceSettings, "mixed": MixedSettings,
    "limit": LimitSettings, "context": ContextSettings, "noisy_neighbour": NoisyNeighbourSettings,
    "soak": SoakSettings, "slo": SloSettings, "ramp_up": RampUpSettings, "predict": PredictSettings,
}  # fmt: skip


@pytest.mark.parametrize("section", sorted(SECTIONS))
def test_every_key_is_in_the_settings_table_with_its_default(section: str) -> None:
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in DOC.read_text().splitlines()
            if line.startswith("| `")}  # fmt: skip
    for key, field in SECTIONS[section].model_fields.items():
        default = list(field.default) if isinstance(field.default, tuple) else field.default
        assert rows.get(f"`{section}.{key}`") == f"`{json.dumps(default)}`", f"{section}.{key}"


def test_every_tenant_key_is_in_the_settings_table() -> None:
    rows = {line.split("|")[1].strip(): line.split("|")[2].strip() for line in DOC.read_text().splitlines()
            if line.startswith("| `")}  # fmt: skip
    for key, field in TenantSettings.model_fields.items():
        shown = rows.get(f"`[[tenants]].{key}`")
        assert shown == ("required" if field.is_required() else f"`{json.dumps(field.default)}`"), key
