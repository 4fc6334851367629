"""The live view of `quantload run`: one line per step, the current one with its progress."""

from __future__ import annotations

import time
from types import TracebackType

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, TaskID

from quantload.cli.progress_line import NOTE_COLUMNS, TITLE_COLUMNS, fitted, progress_columns
from quantload.progress import ProgressCallback


class RichRunView:
    """Shows the whole run on its first line (steps done, total elapsed, the step now), then each
    step as a progress line within 100 columns: done/total, elapsed and the step's own note (with
    its ETA where the step can tell one, as the build does from its own count)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self.started = time.monotonic()
        self._progress = Progress(*progress_columns(), console=console)
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
        started = f" (+{elapsed:.0f}s)"
        shown = escape(fitted(title, TITLE_COLUMNS - len(started)))
        task = self._progress.add_task(f"{shown}[dim]{started}[/]", total=None, note="")
        self._current = task
        self._progress.update(self._run, note=escape(fitted(f"now: {title}", NOTE_COLUMNS)))

        def update(completed: float, total: float | None, note: str = "") -> None:
            shown = escape(fitted(note, NOTE_COLUMNS))
            self._progress.update(task, completed=completed, total=total, note=shown)

        return update

    def message(self, text: str) -> None:
        """A line printed above the progress lines."""
        self._progress.console.print(text, highlight=False, markup=False)
