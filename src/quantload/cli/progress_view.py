"""Rich progress bars for the library's progress callbacks."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from quantload.progress import ProgressCallback


@contextmanager
def progress_bar(console: Console, description: str) -> Iterator[ProgressCallback]:
    """A bar on the console (stderr) driven by a ProgressCallback."""
    columns = (
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
        TextColumn("{task.fields[note]}", style="dim", markup=False),  # notes hold labels as they are
    )
    with Progress(*columns, console=console, transient=True) as progress:
        task = progress.add_task(escape(description), total=None, note="")

        def update(completed: float, total: float | None, note: str = "") -> None:
            progress.update(task, completed=completed, total=total, note=note)

        yield update
