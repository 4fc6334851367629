"""Where quantload keeps its caches, and whether it can write where it is told to."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path

from quantload.errors import ConfigError


def cache_root(configured: Path | None, environ: Mapping[str, str]) -> Path:
    """The user cache folder: the configured one, else $XDG_CACHE_HOME/quantload, else ~/.cache."""
    if configured is not None:
        return configured.expanduser()
    base = environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "quantload"


def check_out_dir(path: Path, flag: str = "--out") -> Path:
    """`path` if quantload can make or fill that folder; ConfigError saying why not, before any work.

    Nothing is created here: a command that fails later for another reason leaves no folder.
    """
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file, not a folder", "give a folder (it is created if absent)")
    existing = path
    while not existing.exists():
        if existing.parent == existing:
            break
        existing = existing.parent
    if not existing.is_dir():
        raise ConfigError(
            f"{flag} {path} cannot be created: {existing} is a file", "give a folder path you can write to"
        )
    refused = write_refused(existing)
    if refused is not None:
        raise ConfigError(
            f"{flag} {path} cannot be written: {existing} refuses a new file ({refused})",
            "give a folder you own",
        )
    return path


def write_refused(folder: Path) -> str | None:
    """Why a new file cannot be made in `folder` (None: it can). The kernel is asked, with a file
    made and removed at once: `os.access` says yes to root where the kernel still says no (/proc,
    an immutable folder, a read-only bind mount)."""
    if not os.access(folder, os.W_OK | os.X_OK):
        return "not writable"
    try:
        with tempfile.TemporaryFile(dir=folder, prefix=".quantload-probe-"):
            pass
    except OSError as error:
        return error.strerror or type(error).__name__
    return None


def check_out_file(path: Path, flag: str = "--out") -> Path:
    """`path` if quantload can write that file (its folder may be made); ConfigError otherwise."""
    if path.is_dir():
        raise ConfigError(f"{flag} {path} is a folder", f"give a file in it, e.g. {path / 'results.json'}")
    check_out_dir(path.parent, f"the folder of {flag} {path.name}")
    if path.exists() and not os.access(path, os.W_OK):
        raise ConfigError(f"{flag} {path} is not writable", "give a file you can write to")
    return path
