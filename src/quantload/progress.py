"""A minimal progress protocol: library code reports, the CLI decides how to show it."""

from __future__ import annotations

from typing import Protocol


class ProgressCallback(Protocol):
    """Called with work done so far, the total when known, and a short note."""

    def __call__(self, completed: float, total: float | None, note: str = "") -> None: ...


def no_progress(completed: float, total: float | None, note: str = "") -> None:
    """A progress callback that shows nothing."""
