"""Labels under which `quality` and `speed` file their results: the quantization, unless one call
measures two files of the same quantization, which are then told apart by file name."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from quantload.models.gguf_meta import read_gguf


def result_labels(models: Sequence[Path]) -> list[str]:
    """One label per model, in order: its file type (e.g. Q8_0), or its file stem when shared."""
    quants = [read_gguf(model).file_type for model in models]
    counts = Counter(quants)
    return [quant if counts[quant] == 1 else model.stem for quant, model in zip(quants, models, strict=True)]
