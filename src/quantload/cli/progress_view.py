"""Rich progress bars for the library's progress callbacks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress

from quantload.cli.progress_line import NOTE_COLUMNS, TITLE_COLUMNS, fitted, progress_columns
from quantload.progress import ProgressCallback


@contextmanager
def progress_bar(console: Console, description: str) -> Iterator[ProgressCallback]:
    """A bar on the console (stderr) driven by a ProgressCallback, within 100 columns."""
    with Progress(*progress_columns(), console=console, transient=True) as progress:
        task = progress.add_task(escape(fitted(description, TITLE_COLUMNS)), total=None, note="")

        def update(completed: float, total: float | None, note: str = "") -> None:
            progress.update(task, completed=completed, total=total, note=escape(fitted(note, NOTE_COLUMNS)))

        yield update
