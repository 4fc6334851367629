"""The command lines of children quantload starts: secrets masked, llama-server's key through its
environment.

Children started for real: tests/integration/test_childproc_processes.py.
"""

from __future__ import annotations

from pathlib import Path

from quantload.childproc import shown_command
from quantload.llamacpp.server import ServerSpec


def test_secret_flags_and_values_are_masked() -> None:
    shown = shown_command(
        ["llama-server", "--api-key", "sk-1", "--hf-token=abc", "-m", "m.gguf", "--header", "Bearer sk-9"],
        secrets=["sk-9"],
    )
    assert shown == "llama-server --api-key *** --hf-token=*** -m m.gguf --header Bearer ***"


def test_llama_server_gets_its_api_key_from_the_environment(tmp_path: Path) -> None:
    spec = ServerSpec(model_path=tmp_path / "m.gguf", alias="m", api_key="sk-secret")
    command = spec.command(tmp_path / "llama-server", 8080)
    assert "sk-secret" not in " ".join(command) and "--api-key" not in command
    assert spec.secret_env() == {"LLAMA_API_KEY": "sk-secret"}
    assert ServerSpec(model_path=tmp_path / "m.gguf", alias="m").secret_env() == {}
