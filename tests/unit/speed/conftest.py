"""Fixtures for the speed tests."""

from __future__ import annotations

from pathlib import Path

import pytest

from quantload.llamacpp.toolchain import Toolchain


@pytest.fixture
def fake_toolchain(tmp_path: Path) -> Toolchain:
    """A Toolchain whose paths are never executed (runs go through a fake runner)."""
    tools = {name: tmp_path / name for name in ("llama-server", "llama-perplexity", "llama-bench")}
    return Toolchain(tools=tools, origin="PATH", binary_version="version: test")
