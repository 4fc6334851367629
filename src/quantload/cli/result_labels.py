"""How `quality` and `speed` file and annotate their results: under the quantization, unless one
call measures two files of the same quantization, which are then told apart by file name."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from quantload.models.manifest import source_note_of


def result_labels(models: Sequence[Path], quants: Sequence[str]) -> list[str]:
    """One label per model, in order: its quantization (e.g. Q8_0), or its file stem when shared."""
    counts = Counter(quants)
    return [quant if counts[quant] == 1 else model.stem for quant, model in zip(quants, models, strict=True)]


def source_notes(models: Sequence[Path]) -> list[str]:
    """The distinct source notes of the prepared files among `models` (see `source_note_of`)."""
    return sorted({note for note in map(source_note_of, models) if note})
