"""Every CSV the report writes (table.csv, compare.csv), written one way: text that a spreadsheet
would run as a formula (a cell starting with =, +, -, @, a tab or a carriage return, e.g. a
quantization label `=HYPERLINK(...)`) is written with a leading apostrophe, which spreadsheets
show as text; numbers are written as they are.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")


def inert(value: Any) -> Any:
    """`value`, with a text that would start a formula made plain text."""
    if isinstance(value, str) and value.startswith(FORMULA_STARTS):
        return "'" + value
    return value


def write_csv(frame: pd.DataFrame, path: Path) -> None:
    """`frame` as CSV at `path`, every text cell made inert (see the module docstring)."""
    safe = frame.copy()
    for column in safe.columns:
        if not pd.api.types.is_numeric_dtype(safe[column]):
            safe[column] = safe[column].map(inert)
    safe.columns = [inert(str(name)) for name in safe.columns]
    safe.to_csv(path, index=False, float_format="%.6g")
