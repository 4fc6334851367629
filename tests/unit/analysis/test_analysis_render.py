"""Markdown and HTML renderers: the same document, safely escaped, images embedded in HTML."""

from __future__ import annotations

import base64
from pathlib import Path

from quantload.analysis.document import (
    Bullets,
    Details,
    Document,
    Facts,
    Image,
    Paragraph,
    Section,
    Table,
    render_html,
    render_markdown,
)

PNG = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


def document() -> Document:
    table = Table(
        ("quant", "TTFT | p99", "perplexity"),
        (("Q8_0", "<b>1 ms</b>", "12.5 ± 0.3"), ("Q4_K_M", "120 ms (110–130 ms)", "–")),
        (False, True, True),
        "a caption",
        "quant-table",
    )
    section = Section(
        "table",
        "The table",
        (
            Facts((("run", "r1"),)),
            Paragraph("note <script>alert(1)</script>", "warning"),
            table,
            Bullets(("one", "two"), "verdict"),
            Image("plots/x.png", "a plot", "caption"),
            Details("more", (Paragraph("inside"),)),
        ),
    )
    return Document("quantload report: m", "run r1", (section,))


def test_markdown_tables_escape_pipes() -> None:
    text = render_markdown(document())
    assert "| quant | TTFT \\| p99 | perplexity |" in text and "|---|---:|---:|" in text
    assert "| Q4_K_M | 120 ms (110–130 ms) | – |" in text
    assert "![a plot](plots/x.png)" in text and "### more" in text


def test_html_is_self_contained_and_escaped(tmp_path: Path) -> None:
    (tmp_path / "plots").mkdir()
    (tmp_path / "plots" / "x.png").write_bytes(PNG)
    page = render_html(document(), tmp_path)
    assert "<script>" not in page and "&lt;script&gt;" in page
    assert "&lt;b&gt;1 ms&lt;/b&gt;" in page
    assert f"data:image/png;base64,{base64.b64encode(PNG).decode()}" in page
    assert 'id="quant-table"' in page and '<td class="num">' in page
    assert '<td class="num">120 ms<span class="range">(110–130 ms)</span></td>' in page
    assert '<td class="num">12.5<span class="range">± 0.3</span></td>' in page
    assert "http://" not in page and "https://" not in page and "<script" not in page
