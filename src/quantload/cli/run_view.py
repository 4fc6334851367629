"""The live view of `quantload run`: one line per step, the current one with its progress."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from quantload.progress import ProgressCallback


class RichRunView:
    """Shows the whole run on its first line (steps done, total elapsed, the step now), then each
    step as a progress line: done/total, elapsed, ETA and the step's own note."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.started = time.monotonic()
        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(bar_width=30),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            TextColumn("{task.fields[note]}", style="dim", markup=False),  # notes hold labels as they are
            console=console,
        )
        self._current: TaskID | None = None
        self._steps_done = 0
        # The first line is the whole run: steps done so far, total elapsed time, the step now.
        self._run = self._progress.add_task("whole run", total=None, note="")

    def __enter__(self) -> RichRunView:
        self._progress.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self._close_current()
        self._progress.update(self._run, total=self._steps_done, completed=self._steps_done, note="")
        self._progress.stop()

    def _close_current(self) -> None:
        if self._current is not None:
            task = self._progress.tasks[self._current]
            if task.total is None:
                self._progress.update(self._current, total=1, completed=1)
            self._current = None
            self._steps_done += 1
            self._progress.update(self._run, completed=self._steps_done)

    def step(self, title: str) -> ProgressCallback:
        """Start a new line for `title` and return the callback that moves it."""
        self._close_current()
        elapsed = time.monotonic() - self.started
        task = self._progress.add_task(f"{escape(title)} [dim](+{elapsed:.0f}s)[/]", total=None, note="")
        self._current = task
        self._progress.update(self._run, note=f"now: {title}")

        def update(completed: float, total: float | None, note: str = "") -> None:
            self._progress.update(task, completed=completed, total=total, note=note[-70:])

        return update

    def message(self, text: str) -> None:
        """A line printed above the progress lines."""
        self._progress.console.print(text, highlight=False, markup=False)
