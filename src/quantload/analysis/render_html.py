"""report.html: one self-contained file, plots embedded as base64 PNG, no script, no network.

The page skeleton and styles come from `analysis/report_template.html` in the checkout (a plain
`string.Template` with $title, $subtitle, $toc and $body), so a team can restyle reports without
touching code; a bare skeleton is used when the checkout's file is not there.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path
from string import Template

from quantload.analysis.document import Block, Bullets, Details, Document, Facts, Image, Paragraph, Table
from quantload.assets import asset_dir
from quantload.errors import QuantloadError

TEMPLATE_NAME = "report_template.html"  # in the top-level analysis/ folder
BARE_TEMPLATE = (
    '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>$title</title></head>'
    "<body><h1>$title</h1><p>$subtitle</p><nav>$toc</nav>$body</body></html>\n"
)


def _e(text: str) -> str:
    return html.escape(text, quote=True)


_SPREAD = re.compile(r"^(.+?) (\(.+\)|± .+)$")


def _cell(text: str, numeric: bool) -> str:
    """A numeric 'median (min–max)' or 'value ± error' cell shows its spread on a second, smaller line."""
    found = _SPREAD.match(text) if numeric else None
    if found is None:
        return _e(text)
    return f'{_e(found.group(1))}<span class="range">{_e(found.group(2))}</span>'


def _table(table: Table) -> str:
    head = "".join(
        f'<th class="{"num" if table.is_numeric(i) else "txt"}" scope="col">{_e(c)}</th>'
        for i, c in enumerate(table.columns)
    )
    body = "".join(
        "<tr>"
        + "".join(
            f'<td class="{"num" if table.is_numeric(i) else "txt"}">{_cell(cell, table.is_numeric(i))}</td>'
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


def _image(image: Image, base: Path) -> str:
    data = base64.b64encode((base / image.file).read_bytes()).decode("ascii")
    caption = f"<figcaption>{_e(image.caption)}</figcaption>" if image.caption else ""
    return (
        f'<figure class="plot" data-file="{_e(image.file)}"><img alt="{_e(image.alt)}"'
        f' src="data:image/png;base64,{data}">{caption}</figure>'
    )


def _block(block: Block, base: Path) -> str:
    if isinstance(block, Paragraph):
        return f'<p class="{block.tone}">{_e(block.text)}</p>'
    if isinstance(block, Bullets):
        items = "".join(f"<li>{_e(item)}</li>" for item in block.items)
        return f'<ul class="{block.tone}">{items}</ul>'
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Image):
        return _image(block, base)
    if isinstance(block, Facts):
        rows = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in block.items)
        return f'<dl class="facts">{rows}</dl>'
    if isinstance(block, Details):
        inner = "".join(_block(b, base) for b in block.blocks)
        return f"<details><summary>{_e(block.summary)}</summary>{inner}</details>"
    raise TypeError(f"unknown block {type(block).__name__}")


def _template() -> Template:
    try:
        return Template((asset_dir("analysis") / TEMPLATE_NAME).read_text(encoding="utf-8"))
    except (OSError, QuantloadError):
        return Template(BARE_TEMPLATE)


def render_html(document: Document, base: Path) -> str:
    """The whole report as one HTML page; images are read from `base` and embedded."""
    toc = "".join(f'<li><a href="#{s.key}">{_e(s.title)}</a></li>' for s in document.sections)
    body = "".join(
        f'<section id="{s.key}"><h2>{_e(s.title)}</h2>'
        + "".join(_block(b, base) for b in s.blocks)
        + "</section>"
        for s in document.sections
    )
    return _template().safe_substitute(
        title=_e(document.title), subtitle=_e(document.subtitle), toc=f"<ol>{toc}</ol>", body=body
    )
