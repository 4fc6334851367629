"""Where quantload keeps its caches."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path


def cache_root(configured: Path | None, environ: Mapping[str, str]) -> Path:
    """The user cache folder: the configured one, else $XDG_CACHE_HOME/quantload, else ~/.cache."""
    if configured is not None:
        return configured.expanduser()
    base = environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "quantload"
