"""One real `quantload run --model tiny --profile ci`, shared by every test that reads a run."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from quantload.llamacpp.toolchain import Toolchain

RUN_TIMEOUT_S = 900


def run_quantload(args: list[str], cwd: Path, timeout_s: float = RUN_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """`quantload ARGS` in a child process, as a user would run it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("QUANTLOAD_") or k == "QUANTLOAD_LLAMA_BIN"}
    return subprocess.run(
        [sys.executable, "-m", "quantload.cli.main", *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout_s, check=False,
    )


def only_run_dir(parent: Path) -> Path:
    (run_dir,) = [p for p in parent.iterdir() if p.is_dir()]
    return run_dir


QuantloadCli = Callable[..., "subprocess.CompletedProcess[str]"]


@pytest.fixture(scope="session")
def quantload_cli() -> QuantloadCli:
    """Runs `quantload ARGS` in a child process."""
    return run_quantload


@pytest.fixture(scope="session")
def ci_run(
    toolchain: Toolchain, tiny_models: dict[str, Path], wikitext_test_raw: Path,
    tmp_path_factory: pytest.TempPathFactory,
) -> Path:
    """The run directory of a complete `quantload run --model tiny --profile ci`."""
    out = tmp_path_factory.mktemp("ci-run")
    result = run_quantload(
        ["run", "--model", "tiny", "--profile", "ci", "--out", str(out), "--dataset", str(wikitext_test_raw)],
        cwd=out,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return only_run_dir(out)
