"""report.md: the Document as GitHub-flavoured Markdown, plots linked as files beside it."""

from __future__ import annotations

from quantload.analysis.document import Block, Bullets, Details, Document, Facts, Image, Paragraph, Table

_PREFIX = {"plain": "", "verdict": "**", "warning": "⚠ ", "muted": "_"}
_SUFFIX = {"plain": "", "verdict": "**", "warning": "", "muted": "_"}


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _table(table: Table) -> list[str]:
    head = "| " + " | ".join(_cell(c) for c in table.columns) + " |"
    rule = "|" + "|".join("---:" if table.is_numeric(i) else "---" for i in range(len(table.columns))) + "|"
    lines = [head, rule] + ["| " + " | ".join(_cell(c) for c in row) + " |" for row in table.rows]
    if table.caption:
        lines += ["", f"_{table.caption}_"]
    return lines


def _block(block: Block, level: int) -> list[str]:
    if isinstance(block, Paragraph):
        return [f"{_PREFIX[block.tone]}{block.text}{_SUFFIX[block.tone]}"]
    if isinstance(block, Bullets):
        mark = "- ⚠ " if block.tone == "warning" else "- "
        return [f"{mark}{item}" for item in block.items]
    if isinstance(block, Table):
        return _table(block)
    if isinstance(block, Image):
        return [f"![{block.alt}]({block.file})"]
    if isinstance(block, Facts):
        return ["| | |", "|---|---|"] + [f"| **{_cell(k)}** | {_cell(v)} |" for k, v in block.items]
    if isinstance(block, Details):
        lines = ["#" * min(level + 1, 6) + f" {block.summary}", ""]
        for inner in block.blocks:
            lines += [*_block(inner, level + 1), ""]
        return lines
    raise TypeError(f"unknown block {type(block).__name__}")


def render_markdown(document: Document) -> str:
    """The whole report as Markdown text."""
    lines = [f"# {document.title}", "", f"_{document.subtitle}_", ""]
    for section in document.sections:
        lines += [f"## {section.title}", ""]
        for block in section.blocks:
            lines += [*_block(block, 2), ""]
    return "\n".join(lines).rstrip() + "\n"
