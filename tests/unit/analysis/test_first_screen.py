"""The report answers on its first screen: one box with the choice, its evidence and what limits
it (or undecided and why), the machine's interference told there when there was any, then a
compact table; parts that did not run listed once; report.md and report.html say the same, and
neither leaks formatting (literal backquotes, escaped '<', "(s)")."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from analysis_synthetic import mark_busy, write_kv, write_quality, write_synthetic_run

from quantload.analysis import ReportPaths, build_report
from quantload.analysis.analyze import analyze_run
from quantload.analysis.chapters import build_document
from quantload.analysis.document import Block, Bullets, Callout, Details, Document, Paragraph
from quantload.analysis.report import draw_figures
from quantload.analysis.run_data import load_run
from quantload.config import ReportSettings, SloSettings
from quantload.llamacpp.server import free_port
from quantload.slo import Slo

QUANTS = ("F16", "Q8_0", "Q4_K_M")
# p50 limits and a loose failure share, so 40 requests a level decide it
SLO = Slo.of(SloSettings(ttft_s=0.35, tpot_s=0.1, ttft_percentile="p50", tpot_percentile="p50", max_failed_frac=0.25))
LOSSES = {"F16": {"f16": (-0.000001, 0.0)}, "Q8_0": {"f16": (0.004, 0.0002)}, "Q4_K_M": {"f16": (0.057, 0.003)}}


def make_run(folder: Path, busy: bool = False) -> Path:
    """Three quantizations at 1, 2, 4, 8 users; every first token a second late at 8 users (and
    at 4 for Q8_0), so each meets up to a level and misses above it."""
    slow = {(quant, 8): 1.0 for quant in QUANTS} | {("Q8_0", 4): 1.0}
    run = write_synthetic_run(folder, quants=QUANTS, users_levels=(1, 2, 4, 8), repeats=2, requests=40,
                              ttft_added_s=slow)  # fmt: skip
    write_quality(run, LOSSES)
    write_kv(run, QUANTS)
    if busy:
        mark_busy(run, ["Q8_0-sweep-0", "Q8_0-sweep-1"], 0.62)
    return run


def _no_prometheus() -> str:
    return f"http://127.0.0.1:{free_port()}"


@dataclass(frozen=True)
class Built:
    run: Path
    prometheus: str  # the unreachable address the report was given (its notes name it)
    paths: ReportPaths


def _built(folder: Path, busy: bool) -> Built:
    run, prometheus = make_run(folder, busy), _no_prometheus()
    return Built(run, prometheus, build_report(run, prometheus, slo=SLO))


@pytest.fixture(scope="module")
def quiet(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return _built(tmp_path_factory.mktemp("quiet") / "run", busy=False)


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return _built(tmp_path_factory.mktemp("busy") / "run", busy=True)


def _texts(blocks: tuple[Block, ...]) -> Iterator[str]:
    for block in blocks:
        if isinstance(block, Paragraph):
            yield block.text
        elif isinstance(block, Bullets):
            yield from block.items
        elif isinstance(block, Callout):
            yield block.heading
            for label, text in block.lines:
                yield label
                yield text
            if block.warning:
                yield block.warning
        elif isinstance(block, Details):
            yield block.summary
            yield from _texts(block.blocks)


def _plain_markdown(text: str) -> str:
    text = re.sub(r"\\(.)", r"\1", text)  # backslash escapes
    text = text.replace("**", "").replace("`", "").replace("&lt;", "<").replace("&amp;", "&")
    text = re.sub(r"(?m)^(> ?|- ⚠ |- |#+ |_)", "", text)
    return " ".join(text.replace("_\n", "\n").split())


def _plain_html(page: str) -> str:
    inline = re.sub(r"</?code>", "", page)  # a code span is part of its sentence
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", inline)).split())


def _document(run: Path, prometheus: str, out: Path) -> Document:
    """The document the report was written from, built again (its figures drawn into `out`)."""
    analysis = analyze_run(load_run(run), ReportSettings(), prometheus, slo=SLO)
    return build_document(analysis, draw_figures(analysis, out))


def test_the_answer_box_comes_first_with_the_choice_its_evidence_and_its_limit(quiet: Built) -> None:
    paths = quiet.paths
    markdown, page = paths.markdown.read_text(), paths.html.read_text()
    box = markdown.split("## The answer", 1)[1].split("## ", 1)[0]
    assert "> **Serve F16**" in box  # within 0.05 nats, the capacities tie, so the smallest loss
    assert "**Choice:** F16, served with `-np 8 -c 32768 -ctk f16 -ctv f16`" in box
    assert "**Latency:** meets the SLO up to 4 concurrent users; misses from 8" in box
    assert "**Quality:** mean KLD from F16 0.000000 nats" in box  # never below zero
    assert "**Limited by:** latency: at 8 concurrent users the SLO is missed" in box
    assert "machine was busy" not in box
    sections = re.findall(r"(?m)^## (.+)$", markdown)
    assert sections[:3] == ["The answer", "The table: one row per quantization", "Verdicts and run details"]
    assert page.index('class="decision"') < page.index('id="quant-table"')
    assert '<code>-np 8 -c 32768 -ctk f16 -ctv f16</code>' in page
    header = page.split('id="quant-table"', 1)[1].split("</thead>", 1)[0]
    assert header.count("<th ") == 7 + 4  # seven columns, then one per load level


def test_a_busy_machine_is_told_on_the_first_screen_with_when_how_much_and_what_to_do(busy: Built) -> None:
    paths = busy.paths
    box = paths.markdown.read_text().split("## The answer", 1)[1].split("## ", 1)[0]
    busy = next(line for line in box.splitlines() if "machine was busy" in line)
    assert "other processes took up to 62 % of the CPUs during 2 of 36 load stages" in busy
    assert "(Q8_0 sweep at 1, 2 users; " in busy and " UTC)" in busy  # which stages, and when
    assert "a miss there is undecided, not a miss" in busy
    assert "`quantload run --exclusive` (`make run EXCLUSIVE=1`)" in busy
    page = paths.html.read_text()
    first_screen = page.split('id="quant-table"', 1)[0]
    assert '<p class="busy">⚠ The machine was busy' in first_screen
    assert "<code>quantload run --exclusive</code>" in first_screen


def test_markdown_and_html_say_the_same_and_leak_no_formatting(busy: Built, tmp_path: Path) -> None:
    markdown, page = busy.paths.markdown.read_text(), busy.paths.html.read_text()
    plain_md, plain_html = _plain_markdown(markdown), _plain_html(page)
    document = _document(busy.run, busy.prometheus, tmp_path / "again")
    for section in document.sections:
        for text in _texts(section.blocks):
            said = " ".join(text.replace("`", "").split())
            assert said in plain_md, f"report.md lacks: {said[:120]}"
            assert said in plain_html, f"report.html lacks: {said[:120]}"
    assert not re.search(r"\w\(s\)", markdown + plain_html), "a count written as '(s)'"
    assert "\\`" not in markdown and "`" not in plain_html  # commands are code, not literal backquotes
    assert not re.search(r"&lt;[\s\d]", markdown) and "&amp;lt;" not in page  # a lone '<' reads as '<'
    assert "-0.000001" not in markdown  # a divergence is never negative


def test_parts_that_did_not_run_are_one_list_with_their_reasons(quiet: Built) -> None:
    markdown = quiet.paths.markdown.read_text()
    headings = re.findall(r"(?m)^## (.+)$", markdown)
    assert "Not run in this run" in headings
    listed = markdown.split("## Not run in this run", 1)[1].split("\n## ", 1)[0]
    for title, why in (
        ("Open loop (Poisson arrivals)", "no open-loop rates were configured (load.rates_rps)"),
        ("Trace replay", "no trace was given (trace.path)"),
        ("Multi-turn sessions", "no complete sessions stage"),
    ):
        assert f"- {title}: {why}" in listed
        assert title not in headings
    # an experiment whose input was not given is not a failure: listed too, with the missing input
    assert "- The noisy neighbour: not run because fewer than two \\[\\[tenants\\]\\]" in listed
