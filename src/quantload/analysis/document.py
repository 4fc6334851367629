"""A renderer-neutral report (sections of paragraphs, lists, tables, facts and images) and its two
serialisations: report.md (GitHub-flavoured Markdown, plots linked as files beside it) and
report.html (one self-contained file, plots embedded as base64 PNG, no script, no network).

The chapters fill a Document once; the renderers only serialise it, so the two files always say
the same thing. The HTML page skeleton and styles come from `analysis/report_template.html` in the
checkout (a plain `string.Template` with $title, $subtitle, $toc and $body), so a team can restyle
reports without touching code; a bare skeleton is used when the checkout's file is not there.
"""

from __future__ import annotations

import base64
import html
import re
from dataclasses import dataclass, field
from pathlib import Path
from string import Template
from typing import Literal

from quantload.assets import asset_dir
from quantload.errors import QuantloadError

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


@dataclass(frozen=True)
class Callout:
    """The report's answer, boxed: a heading and labelled lines ("Choice", "Limited by"), each
    (label, text); a warning line is shown apart from the others."""

    heading: str
    lines: tuple[tuple[str, str], ...]
    warning: str = ""


Block = Paragraph | Bullets | Table | Image | Facts | Details | Callout


@dataclass(frozen=True)
class Section:
    """A report section; one that did not run holds only why (`not_run`), and the document lists
    all of those together instead of a heading each."""

    key: str
    title: str
    blocks: tuple[Block, ...] = field(default_factory=tuple)
    not_run: str = ""


NOT_RUN_KEY = "not-run"


def gathered(sections: tuple[Section, ...], before: str = "") -> tuple[Section, ...]:
    """`sections` with those that did not run taken out and listed, with their reasons, in one
    section placed before the section keyed `before` (at the end when there is none)."""
    skipped = [section for section in sections if section.not_run]
    kept = [section for section in sections if not section.not_run]
    if not skipped:
        return tuple(kept)
    lines = tuple(f"{section.title}: {section.not_run}" for section in skipped)
    count = len(skipped)
    summary = f"{count} part{'s' if count != 1 else ''} of the report did not run; why each"
    listing = Section(NOT_RUN_KEY, "Not run in this run", (Details(summary, (Bullets(lines, "muted"),)),))
    keys = [section.key for section in kept]
    at = keys.index(before) if before in keys else len(kept)
    return (*kept[:at], listing, *kept[at:])


@dataclass(frozen=True)
class Document:
    title: str
    subtitle: str
    sections: tuple[Section, ...]


# ----------------------------------------------------------------------------- report.md

_PREFIX = {"plain": "", "verdict": "**", "warning": "⚠ ", "muted": "_"}
_SUFFIX = {"plain": "", "verdict": "**", "warning": "", "muted": "_"}


_MD_ACTIVE = re.compile(r"([\\`*\[\]])")  # backslash, code, emphasis, links and images
_MD_EDGE_UNDERSCORE = re.compile(r"(?<![A-Za-z0-9])_|_(?![A-Za-z0-9])")  # Q4_K_M stays as it is
_MD_LINE_START = re.compile(r"^(#|>|[-+] |\d+[.)] )")
# what could start HTML (a tag, an entity) becomes an entity; "p < 0.05" and "a > b" stay readable
_MD_HTML_LIKE = re.compile(r"&(?=#?\w+;)|<(?=[A-Za-z/!?])")
# `a command` in display text: shown as code in both files; a lone backquote is just a character
CODE_SPAN = re.compile(r"`([^`\n]+)`")


def _md_plain(text: str) -> str:
    text = _MD_HTML_LIKE.sub(lambda found: html.escape(found.group(0)), text)
    return _MD_EDGE_UNDERSCORE.sub(r"\\_", _MD_ACTIVE.sub(r"\\\1", text))


def _md_text(text: str) -> str:
    """Display text as Markdown that shows exactly that text, as report.html does: whatever a run's
    labels, paths and messages hold, no HTML and no Markdown of theirs gets through; a "<" that
    starts no tag stays as it is, so the raw file reads as well as the rendered one; `commands` in
    backquotes are code spans."""
    text = text.replace("\n", " ")
    parts, last = [], 0
    for found in CODE_SPAN.finditer(text):
        parts.append(_md_plain(text[last : found.start()]))
        parts.append(f"`{found.group(1)}`")
        last = found.end()
    parts.append(_md_plain(text[last:]))
    return _MD_LINE_START.sub(r"\\\1", "".join(parts))


def _md_cell(text: str) -> str:
    """A table cell: its lines joined with a middle dot (a Markdown cell holds one line)."""
    return _md_text(" · ".join(text.split("\n"))).replace("|", "\\|")


def _md_table(table: Table) -> list[str]:
    head = "| " + " | ".join(_md_cell(c) for c in table.columns) + " |"
    rule = "|" + "|".join("---:" if table.is_numeric(i) else "---" for i in range(len(table.columns))) + "|"
    lines = [head, rule] + ["| " + " | ".join(_md_cell(c) for c in row) + " |" for row in table.rows]
    if table.caption:
        lines += ["", f"_{_md_text(table.caption)}_"]
    return lines


def _md_block(block: Block, level: int) -> list[str]:
    if isinstance(block, Paragraph):
        return [f"{_PREFIX[block.tone]}{_md_text(block.text)}{_SUFFIX[block.tone]}"]
    if isinstance(block, Bullets):
        mark = "- ⚠ " if block.tone == "warning" else "- "
        return [f"{mark}{_md_text(item)}" for item in block.items]
    if isinstance(block, Table):
        return _md_table(block)
    if isinstance(block, Image):
        return [f"![{_md_text(block.alt)}]({block.file})"]
    if isinstance(block, Facts):
        return ["| | |", "|---|---|"] + [f"| **{_md_cell(k)}** | {_md_cell(v)} |" for k, v in block.items]
    if isinstance(block, Details):
        lines = ["#" * min(level + 1, 6) + f" {_md_text(block.summary)}", ""]
        for inner in block.blocks:
            lines += [*_md_block(inner, level + 1), ""]
        return lines
    if isinstance(block, Callout):
        lines = [f"> **{_md_text(block.heading)}**", ">"]
        lines += [f"> - **{_md_text(label)}:** {_md_text(text)}" for label, text in block.lines]
        if block.warning:
            lines += [">", f"> ⚠ {_md_text(block.warning)}"]
        return lines
    raise TypeError(f"unknown block {type(block).__name__}")


def render_markdown(document: Document) -> str:
    """The whole report as Markdown text."""
    lines = [f"# {_md_text(document.title)}", "", f"_{_md_text(document.subtitle)}_", ""]
    for section in document.sections:
        lines += [f"## {_md_text(section.title)}", ""]
        for block in section.blocks:
            lines += [*_md_block(block, 2), ""]
    return "\n".join(lines).rstrip() + "\n"


# ----------------------------------------------------------------------------- report.html

TEMPLATE_NAME = "report_template.html"  # in the top-level analysis/ folder
BARE_TEMPLATE = (
    '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>$title</title></head>'
    "<body><h1>$title</h1><p>$subtitle</p><nav>$toc</nav>$body</body></html>\n"
)


def _e(text: str) -> str:
    """Display text as HTML: escaped, `commands` in backquotes as code."""
    parts, last = [], 0
    for found in CODE_SPAN.finditer(text):
        parts.append(html.escape(text[last : found.start()], quote=True))
        parts.append(f"<code>{html.escape(found.group(1), quote=True)}</code>")
        last = found.end()
    parts.append(html.escape(text[last:], quote=True))
    return "".join(parts)


def _lines(text: str) -> str:
    """A cell's lines, each escaped, one under the other."""
    return "<br>".join(_e(line) for line in text.split("\n"))


_SPREAD = re.compile(r"^(.+?) (\(.+\)|± .+)$")


def _html_cell(text: str, numeric: bool) -> str:
    """A numeric 'median (min–max)' or 'value ± error' cell shows its spread on a second, smaller line."""
    found = _SPREAD.match(text) if numeric and "\n" not in text else None
    if found is None:
        return _lines(text)
    return f'{_e(found.group(1))}<span class="range">{_e(found.group(2))}</span>'


def _html_class(table: Table, index: int) -> str:
    return "num" if table.is_numeric(index) else "txt"


def _html_table(table: Table) -> str:
    head = "".join(
        f'<th class="{_html_class(table, i)}" scope="col">{_lines(c)}</th>'
        for i, c in enumerate(table.columns)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{_html_class(table, i)}">{_html_cell(cell, table.is_numeric(i))}</td>'
            for i, cell in enumerate(row)
        )
        + "</tr>"
        for row in table.rows
    )
    name = f' id="{_e(table.name)}"' if table.name else ""
    caption = f"<caption>{_e(table.caption)}</caption>" if table.caption else ""
    return (
        f'<div class="table-wrap"><table{name} class="data">{caption}<thead><tr>{head}</tr></thead>'
        f"<tbody>{body}</tbody></table></div>"
    )


def _html_image(image: Image, base: Path) -> str:
    data = base64.b64encode((base / image.file).read_bytes()).decode("ascii")
    caption = f"<figcaption>{_e(image.caption)}</figcaption>" if image.caption else ""
    return (
        f'<figure class="plot" data-file="{_e(image.file)}"><img alt="{_e(image.alt)}"'
        f' src="data:image/png;base64,{data}">{caption}</figure>'
    )


def _html_block(block: Block, base: Path) -> str:
    if isinstance(block, Paragraph):
        return f'<p class="{block.tone}">{_e(block.text)}</p>'
    if isinstance(block, Bullets):
        items = "".join(f"<li>{_e(item)}</li>" for item in block.items)
        return f'<ul class="{block.tone}">{items}</ul>'
    if isinstance(block, Table):
        return _html_table(block)
    if isinstance(block, Image):
        return _html_image(block, base)
    if isinstance(block, Facts):
        rows = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in block.items)
        return f'<dl class="facts">{rows}</dl>'
    if isinstance(block, Details):
        inner = "".join(_html_block(b, base) for b in block.blocks)
        return f"<details><summary>{_e(block.summary)}</summary>{inner}</details>"
    if isinstance(block, Callout):
        rows = "".join(f"<dt>{_e(label)}</dt><dd>{_e(text)}</dd>" for label, text in block.lines)
        warning = f'<p class="busy">⚠ {_e(block.warning)}</p>' if block.warning else ""
        return f'<div class="decision"><h3>{_e(block.heading)}</h3><dl>{rows}</dl>{warning}</div>'
    raise TypeError(f"unknown block {type(block).__name__}")


def _template() -> Template:
    try:
        return Template((asset_dir("analysis") / TEMPLATE_NAME).read_text(encoding="utf-8"))
    except (OSError, QuantloadError):
        return Template(BARE_TEMPLATE)


def render_html(document: Document, base: Path) -> str:
    """The whole report as one HTML page; images are read from `base` and embedded."""
    entries = "".join(f'<li><a href="#{s.key}">{_e(s.title)}</a></li>' for s in document.sections)
    count = len(document.sections)
    toc = f"<details><summary>Contents ({count} sections)</summary><ol>{entries}</ol></details>"
    body = "".join(
        f'<section id="{s.key}"><h2>{_e(s.title)}</h2>'
        + "".join(_html_block(b, base) for b in s.blocks)
        + "</section>"
        for s in document.sections
    )
    return _template().safe_substitute(
        title=_e(document.title), subtitle=_e(document.subtitle), toc=toc, body=body
    )
