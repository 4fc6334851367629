"""A renderer-neutral report: sections of paragraphs, lists, tables, facts and images.

The section builders fill it once; render_md and render_html only serialise it, so the two
files always say the same thing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Tone = Literal["plain", "verdict", "warning", "muted"]


@dataclass(frozen=True)
class Paragraph:
    text: str
    tone: Tone = "plain"


@dataclass(frozen=True)
class Bullets:
    items: tuple[str, ...]
    tone: Tone = "plain"


@dataclass(frozen=True)
class Table:
    """Cells are display text; `numeric` marks right-aligned columns."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, ...], ...]
    numeric: tuple[bool, ...] = ()
    caption: str = ""
    name: str = ""

    def is_numeric(self, index: int) -> bool:
        return index < len(self.numeric) and self.numeric[index]


@dataclass(frozen=True)
class Image:
    """A PNG written beside the report; `file` is relative to the report's folder."""

    file: str
    alt: str
    caption: str = ""


@dataclass(frozen=True)
class Facts:
    items: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Details:
    """Long material shown folded in HTML, as a sub-heading in Markdown."""

    summary: str
    blocks: tuple[Block, ...]


Block = Paragraph | Bullets | Table | Image | Facts | Details


@dataclass(frozen=True)
class Section:
    key: str
    title: str
    blocks: tuple[Block, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class Document:
    title: str
    subtitle: str
    sections: tuple[Section, ...]
