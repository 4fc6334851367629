"""Progress lines that fit 100 columns: the step's title, a bar, done/total, the time taken, the
time left, and the step's own note (the build's '[37/222] eta 6m10s', a stage's name), each part
cut at a word boundary where it must be, never mid-word."""

from __future__ import annotations

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

LINE_COLUMNS = 100
TITLE_COLUMNS = 32
BAR_COLUMNS = 14
COUNT_COLUMNS = 11  # "1234/56789" and a space
ELAPSED_COLUMNS = 8  # "0:12:34" and a space
ETA_COLUMNS = 10  # "eta 12:34" and a space
NOTE_COLUMNS = LINE_COLUMNS - TITLE_COLUMNS - BAR_COLUMNS - COUNT_COLUMNS - ELAPSED_COLUMNS - ETA_COLUMNS - 4


def fitted(text: str, columns: int) -> str:
    """`text` in at most `columns` characters: whole words, then '…' where some were left out."""
    text = " ".join(text.split())
    if len(text) <= columns:
        return text
    cut = text[: columns - 1].rsplit(" ", 1)[0] if " " in text[: columns - 1] else text[: columns - 1]
    return cut.rstrip(" ,;:(") + "…"


def progress_columns() -> tuple[ProgressColumn, ...]:
    """The columns of every progress line (the task's description and note are fitted by whoever
    sets them)."""
    return (
        TextColumn("[bold]{task.description}"),
        BarColumn(bar_width=BAR_COLUMNS),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(compact=True),
        TextColumn("{task.fields[note]}", style="dim"),
    )
