"""Grafana credentials for the stage annotations: a token first, then user and password; `config
show` masks them.

The load path pushing annotations to a fake Grafana (processes):
tests/integration/observe/test_grafana_push_processes.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import SecretStr

from quantload.cli.main import main as cli_main
from quantload.config import ObserveSettings, load_config
from quantload.observe.annotations import grafana_credential


def test_credentials_token_first_then_user_and_password(tmp_path: Path) -> None:
    assert grafana_credential(ObserveSettings()) is None
    assert grafana_credential(ObserveSettings(grafana_user="admin")) is None
    assert grafana_credential(ObserveSettings(grafana_user="a", grafana_password=SecretStr("b"))) == (
        "a",
        "b",
    )
    both = ObserveSettings(grafana_token=SecretStr("t"), grafana_user="a", grafana_password=SecretStr("b"))
    assert grafana_credential(both) == "t"
    env = {
        "QUANTLOAD_OBSERVE__GRAFANA_URL": "http://grafana:3000",
        "QUANTLOAD_OBSERVE__GRAFANA_USER": "admin",
        "QUANTLOAD_OBSERVE__GRAFANA_PASSWORD": "a,b",  # the env layer splits at commas
        "QUANTLOAD_OBSERVE__GRAFANA_TOKEN": "12345",  # and parses numbers
    }
    observe = load_config(tmp_path, env).settings.observe
    assert observe.grafana_password is not None and observe.grafana_password.get_secret_value() == "a,b"
    assert observe.grafana_token is not None and observe.grafana_token.get_secret_value() == "12345"


def test_config_show_masks_grafana_secrets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("QUANTLOAD_OBSERVE__GRAFANA_USER", "ops")
    monkeypatch.setenv("QUANTLOAD_OBSERVE__GRAFANA_PASSWORD", "pw-s3cret")
    monkeypatch.setenv("QUANTLOAD_OBSERVE__GRAFANA_TOKEN", "glsa_s3cret")
    assert cli_main(["config", "show", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["observe.grafana_user"]["value"] == "ops"
    for key in ("observe.grafana_password", "observe.grafana_token"):
        assert shown[key] == {
            "value": "**********",
            "source": f"env:QUANTLOAD_{key.upper().replace('.', '__')}",
        }
