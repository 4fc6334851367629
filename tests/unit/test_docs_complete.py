"""The documentation holds figures, not the markers left where figures were still to be measured."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# a line that is nothing but an upper-case token (TIMINGS_TABLE, MEASURED-SMOLLM2) marks a figure
# still to be filled in
MARKER = re.compile(r"^[A-Z][A-Z0-9]*(?:[_-][A-Z0-9]+)+$")


def test_no_document_keeps_a_marker_for_figures_still_to_measure() -> None:
    documents = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md")), REPO / "benchmarks" / "README.md"]
    left = [
        f"{path.relative_to(REPO)}:{number}: {line}"
        for path in documents
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1)
        if MARKER.match(line.strip())
    ]
    assert not left, left
