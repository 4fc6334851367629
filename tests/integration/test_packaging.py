"""The built wheel carries the prometheus/ and analysis/ files the package reads (as the Docker
image's `pip install .` does, from exactly what its .dockerignore sends)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from compose.dockerfile import DockerIgnore

from quantload.assets import PACKAGED_DIR, PACKAGED_FILES

REPO = Path(__file__).resolve().parents[2]
DOCKERIGNORE = REPO / ".dockerignore"

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _build_context(target: Path) -> Path:
    """A copy of the files the image build is sent (tracked files the .dockerignore lets through)."""
    ignore = DockerIgnore(DOCKERIGNORE)
    listed = subprocess.run(
        ["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    ).stdout.splitlines()
    for name in listed:
        if ignore.sends(name) and (REPO / name).is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, target / name)
    return target


def test_the_wheel_from_the_image_context_ships_the_assets(tmp_path: Path) -> None:
    context = _build_context(tmp_path / "context")
    wheels = tmp_path / "wheels"
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--disable-pip-version-check",
         "-w", str(wheels), str(context)],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = wheels.glob("quantload-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for relative in PACKAGED_FILES:
        assert f"quantload/{PACKAGED_DIR}/{relative}" in names, relative
    assert "quantload/exporter/fake_server.py" not in names  # test code lives in tests/
    assert "quantload/load/fakeserver.py" in names  # `quantload calibrate` runs it

    # Installed on its own, away from the checkout, the package finds its copies.
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    probe = (
        "from quantload.assets import asset_dir\n"
        "from quantload.observe.prometheus import prometheus_config_dir\n"
        "print(asset_dir('analysis'))\n"
        "print(prometheus_config_dir())\n"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    shown = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    analysis_dir, prometheus_dir = (Path(line) for line in shown.stdout.split())
    assert analysis_dir == site / "quantload" / PACKAGED_DIR / "analysis"
    assert (prometheus_dir / "rules" / "quantload.rules.yml").is_file()
    assert (analysis_dir / "report_template.html").read_bytes() == (REPO / "analysis" / "report_template.html").read_bytes()
