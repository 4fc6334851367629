"""Build hook: ship the top-level prometheus/ and analysis/ files inside the wheel.

Everything else about the package is in pyproject.toml. The list of files is
quantload.assets.PACKAGED_FILES, which also says where the package looks for them.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT / "src"))
from quantload.assets import PACKAGED_DIR, PACKAGED_FILES  # noqa: E402


class BuildPyWithAssets(build_py):
    """The usual build_py, then the asset copies under quantload/_assets/."""

    def run(self) -> None:
        super().run()
        for relative in PACKAGED_FILES:
            target = Path(self.build_lib) / "quantload" / PACKAGED_DIR / relative
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(ROOT / relative, target)


setup(cmdclass={"build_py": BuildPyWithAssets})
