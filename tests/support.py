"""Helpers shared by the test folders (importable as `support`: pytest puts tests/ on sys.path)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

RUN_TIMEOUT_S = 900


# The API key the shared ci run's servers require (the run must never write it anywhere).
CI_API_KEY = "sk-ci-7f3a9c2e51d8"

# Beside the shared ci run's folder: the annotation bodies the run pushed to a fake Grafana.
GRAFANA_ANNOTATIONS_JSON = "grafana-annotations.json"


def missing(reason: str) -> None:
    """Skip, or fail when CI demands every integration test to run (QUANTLOAD_REQUIRE_INTEGRATION=1)."""
    if os.environ.get("QUANTLOAD_REQUIRE_INTEGRATION") == "1":
        pytest.fail(f"required for integration tests: {reason}")
    pytest.skip(reason)


def require_binary(name: str, install_hint: str) -> str:
    """The path of `name`, or skip/fail naming how to install it."""
    path = shutil.which(name)
    if path is None:
        missing(f"{name} is not installed ({install_hint})")
    assert path is not None
    return path


def clean_env() -> dict[str, str]:
    """The environment without the developer's own QUANTLOAD_* configuration."""
    keep = ("QUANTLOAD_LLAMA_BIN",)
    return {k: v for k, v in os.environ.items() if not k.startswith("QUANTLOAD_") or k in keep}


def run_quantload(
    args: list[str], cwd: Path, timeout_s: float = RUN_TIMEOUT_S, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """`quantload ARGS` in a child process, as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "quantload.cli.main", *args],
        cwd=cwd, env=env if env is not None else clean_env(), capture_output=True, text=True,
        timeout=timeout_s, check=False,
    )


def machine_has_gpu() -> bool:
    """Whether the exporter finds a GPU through NVML on this machine (so GPU series can exist)."""
    from quantload.exporter.gpu import open_gpu_telemetry
    from quantload.nvml import system_nvml

    telemetry = open_gpu_telemetry(system_nvml, 1.0)
    if telemetry is None:
        return False
    telemetry.close()
    return True


def gaps_besides_the_absent_gpu(not_measured: list[dict[str, str]]) -> list[dict[str, str]]:
    """A report's not_measured less the GPU-energy line, which it must give exactly where this
    machine has no GPU (no NVML series can exist then)."""
    from quantload.analysis.gpu_energy import NO_GPU_WHY, SECTION

    gpu = [gap for gap in not_measured if gap["section"] == SECTION]
    if machine_has_gpu():
        assert not gpu, gpu
    else:
        assert [gap["why"] for gap in gpu] == [NO_GPU_WHY], gpu
    return [gap for gap in not_measured if gap["section"] != SECTION]
