"""Fixtures of the analysis unit tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from analysis_synthetic import write_synthetic_run


@pytest.fixture
def synthetic_run(tmp_path: Path) -> Path:
    """Two quantizations, two user levels, two repeats, six requests per stage, no failures."""
    return write_synthetic_run(tmp_path / "synthetic-run")
