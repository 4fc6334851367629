"""A llama.cpp build step (a child Python stands in) past its deadline is stopped and said.

Moved from tests/unit/test_build_backend.py, whose other tests start no process.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from quantload.errors import ToolchainError
from quantload.llamacpp.build import (
    run_logged,
)

pytestmark = pytest.mark.integration


def test_a_build_past_its_deadline_is_stopped_and_said(tmp_path: Path) -> None:
    started = time.monotonic()
    command = [sys.executable, "-c", "import time; print('[1/9] compiling', flush=True); time.sleep(60)"]
    with pytest.raises(ToolchainError, match="build_timeout_s"):
        run_logged(command, tmp_path / "build.log", deadline=time.monotonic() + 1.0)
    assert time.monotonic() - started < 20
